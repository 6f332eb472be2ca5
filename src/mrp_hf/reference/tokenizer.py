"""The reference DLM's character-level tokenizer (a real `PreTrainedTokenizerFast`, built with `tokenizers`)."""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

#: special tokens first, so their ids are fixed: pad 0, mask 1, eos 2, unk 3
SPECIAL_TOKENS = ("[PAD]", "[MASK]", "[EOS]", "[UNK]")
CHARACTERS = "abcdefghijklmnopqrstuvwxyz0123456789:=+-?,"


def build_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character of `CHARACTERS`; anything else is [UNK]; decoding concatenates characters."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + tuple(CHARACTERS))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="[PAD]",
        mask_token="[MASK]",
        eos_token="[EOS]",
        unk_token="[UNK]",
        padding_side="left",
        model_max_length=64,
    )
    return tokenizer
