"""The reference DLM: tokenizer, tasks and checkers, the model's attention and cache, and the engine on it."""

import random

import pytest
import torch

import mrp_hf
from mrp_hf import MRPModel
from mrp_hf.reference import ReferenceDLM, ReferenceDLMConfig, build_tokenizer, check_answer, held_out_items
from mrp_hf.reference.tasks import ANSWER_LENGTH, PROMPT_LENGTH, TASKS, is_held_out, training_sample
from mrp_hf.reference.train import encode, make_batch, training_pattern


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def tiny_reference(attention="block_causal", seed=0, block_position_embedding=False):
    torch.manual_seed(seed)
    tok = build_tokenizer()
    config = ReferenceDLMConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=2, block_size=4, attention=attention,
                                mask_token_id=tok.mask_token_id, pad_token_id=tok.pad_token_id,
                                eos_token_id=tok.eos_token_id, block_position_embedding=block_position_embedding)
    return ReferenceDLM(config).eval()


def test_tokenizer_round_trip_and_special_ids(tokenizer, tmp_path):
    assert (tokenizer.pad_token_id, tokenizer.mask_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    ids = tokenizer("sort:hdkb", add_special_tokens=False)["input_ids"]
    assert len(ids) == 9 and tokenizer.decode(ids) == "sort:hdkb"
    assert tokenizer("ab[EOS][EOS]", add_special_tokens=False)["input_ids"][2:] == [2, 2]
    tokenizer.save_pretrained(tmp_path)
    from transformers import AutoTokenizer

    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again("kv:a1?a", add_special_tokens=False)["input_ids"] == tokenizer("kv:a1?a", add_special_tokens=False)["input_ids"]


def test_every_task_checks_its_own_answers_and_rejects_wrong_ones(tokenizer):
    rng = random.Random(0)
    for name, task in TASKS.items():
        for _ in range(50):
            prompt, answer = task.make(rng)
            assert len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) <= PROMPT_LENGTH
            assert len(answer) < ANSWER_LENGTH
            assert check_answer(name, prompt, answer), (name, prompt, answer)
            assert not check_answer(name, prompt, answer + "x")
            assert not check_answer(name, prompt, "")
    # one form for sort; several valid forms where the task says so, the sure spans checked exactly
    assert check_answer("sort", "sort:dbca", "abcd,dcba") and not check_answer("sort", "sort:dbca", "abcd,abcd")
    assert check_answer("perm", "perm:abc", "abc=cab=bac") and check_answer("perm", "perm:abc", "abc=abc=cba")
    assert not check_answer("perm", "perm:abc", "abc=aab=baa") and not check_answer("perm", "perm:abc", "abc=cab=cab")
    assert check_answer("swap", "swap:abcdefgh", "ab-dc-ef-hg=gh-fe-cd-ba")
    assert check_answer("swap", "swap:abcdefgh", "ba-dc-fe-hg=gh-ef-cd-ab")
    assert not check_answer("swap", "swap:abcdefgh", "ab-dc-ef-hg=hg-fe-cd-ba")  # the reversal follows the pairs
    assert not check_answer("swap", "swap:abcdefgh", "aa-dc-ef-hg=gh-fe-cd-aa")
    assert not check_answer("swap", "swap:abcdefgh", "ab-dc-ef=fe-cd-ba")
    assert check_answer("pair", "pair:9:xyz", "xyz,4+5=9,5+4=9") and check_answer("pair", "pair:9:xyz", "xyz,9+0=9,0+9=9")
    assert not check_answer("pair", "pair:9:xyz", "xyz,4+6=9,6+4=9") and not check_answer("pair", "pair:9:xyz", "xyz,4+5=9,4+5=9")
    assert not check_answer("pair", "pair:9:xyz", "xyz,45=9,54=9")


def test_held_out_split_is_disjoint_from_training():
    rng = random.Random(3)
    assert not any(is_held_out(training_sample(rng)[1]) for _ in range(3000))
    items = held_out_items(per_task=5)
    assert len(items) == 5 * len(TASKS) and all(is_held_out(i.prompt) for i in items)
    assert held_out_items(per_task=5) == items  # the same list every time
    assert all(item.check(item.reference_answer) for item in items)


def test_training_layout_matches_decoding(tokenizer):
    """A noisy answer block sees the prompt, the clean earlier answer blocks and itself; nothing else."""
    prompt_ids, answer_ids = encode(tokenizer, "rev:abcd", "dcba")
    assert answer_ids[4:] == [tokenizer.eos_token_id] * (ANSWER_LENGTH - 4)
    prompt_mask = torch.zeros(1, PROMPT_LENGTH, dtype=torch.bool)
    prompt_mask[0, -len(prompt_ids):] = True
    pattern = training_pattern(prompt_mask, block=4)[0, 0]  # two answer blocks of 4: the clean copy is used
    p, a = PROMPT_LENGTH, ANSWER_LENGTH
    prompt_keys = list(range(p - len(prompt_ids), p))
    assert pattern[p + 4].nonzero().squeeze(1).tolist() == prompt_keys + list(range(p + 4, p + 8)) + list(range(p + a, p + a + 4))
    assert pattern[p].nonzero().squeeze(1).tolist() == prompt_keys + list(range(p, p + 4))
    ids, pattern, positions, labels = make_batch(tokenizer, random.Random(0), torch.Generator().manual_seed(0), 4, 4)
    total = p + a + (a - 4)  # the clean copy drops the last answer block (no noisy block reads it)
    assert ids.shape == (4, total) and pattern.shape == (4, 1, total, total)
    assert torch.equal(positions[0, p : p + a - 4], positions[0, p + a :])
    masked = ids[:, p : p + a] == tokenizer.mask_token_id
    assert torch.equal(labels[:, p : p + a] != -100, masked) and (labels[:, :p] == -100).all()
    assert masked.view(4, a // 4, 4).any(dim=-1).all()  # every answer block has a masked position
    ids, pattern, _, _ = make_batch(tokenizer, random.Random(0), torch.Generator().manual_seed(0), 2, 8)
    assert ids.shape == (2, p + a + a - 8)  # blocks of 8: the clean copy holds the first a - 8 answer tokens


@pytest.mark.parametrize("attention,block_positions", [("block_causal", False), ("bidirectional", False),
                                                       ("block_causal", True)])
def test_adapter_cache_and_batch_invariance(attention, block_positions):
    model = tiny_reference(attention, block_position_embedding=block_positions)
    adapter = mrp_hf.get_adapter(model)
    assert adapter.family == "mrp_reference" and adapter.mask_token_id == 1
    assert adapter.block_causal == (attention == "block_causal")
    assert adapter.exact_prefix_cache == (attention == "block_causal")
    wrapped = MRPModel.from_backbone(model)
    tok = build_tokenizer()
    enc = tok(["sort:dbca", "add:12+34", "kv:a1b2c3d4?ba"], return_tensors="pt", padding=True, add_special_tokens=False)
    kwargs = dict(max_new_tokens=8, block_length=4, tokens_per_step=1, eos_token_id=2, pad_token_id=0)
    out = wrapped.generate(enc["input_ids"], attention_mask=enc["attention_mask"], **kwargs)
    no_cache = wrapped.generate(enc["input_ids"], attention_mask=enc["attention_mask"], prefix_cache=False, **kwargs)
    assert torch.equal(out, no_cache)
    for row in range(3):
        keep = enc["attention_mask"][row].bool()
        alone = wrapped.generate(enc["input_ids"][row, keep][None], **kwargs)
        assert torch.equal(alone[0], out[row, -alone.shape[1]:])


def test_save_load_through_auto_classes(tmp_path):
    from transformers import AutoConfig, AutoModelForMaskedLM

    model = tiny_reference(block_position_embedding=True)
    model.save_pretrained(tmp_path)
    assert type(AutoConfig.from_pretrained(tmp_path)).__name__ == "ReferenceDLMConfig"
    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path)
    ids = torch.tensor([[5, 6, 7, 1, 1]])
    assert torch.allclose(loaded(ids).logits, model(ids).logits)
    assert isinstance(mrp_hf.load_backbone(str(tmp_path)), ReferenceDLM)


def test_the_reference_dlms_own_generate_is_diffusion_decoding_not_autoregressive():
    """ReferenceDLM has GenerationMixin (for custom_generate): its plain generate() must still be masked diffusion
    decoding, the library's static decoding, not transformers' left-to-right loop."""
    import torch

    from mrp_hf import MRPModel
    from mrp_hf.backbones import load_backbone
    from mrp_hf.reference import bundled

    backbone = load_backbone(str(bundled.backbone_path()))
    prompt = torch.tensor([[4, 5, 6, 7, 8]])
    expected = MRPModel.from_backbone(backbone).generate(prompt, attention_mask=torch.ones_like(prompt))
    assert torch.equal(backbone.generate(prompt, attention_mask=torch.ones_like(prompt)), expected)
    assert (expected[0, prompt.shape[1]:] != backbone.config.mask_token_id).all()


def test_block_position_embedding_reads_the_position_inside_the_block():
    """The in-block embedding depends on position id modulo the block. Rotary positions are relative, so shifting
    every position id by a whole block changes no output, and shifting by one changes them only through the
    in-block embedding."""
    model = tiny_reference(block_position_embedding=True)
    assert model.embed_block_positions.num_embeddings == model.config.block_size == 4
    ids = torch.tensor([[5, 6, 7, 1, 1, 8, 9, 1]])
    with torch.no_grad():
        model.embed_block_positions.weight.normal_(std=1.0)
        base = model(ids, position_ids=torch.arange(8)[None]).logits
        whole_block = model(ids, position_ids=torch.arange(4, 12)[None]).logits
        one = model(ids, position_ids=torch.arange(1, 9)[None]).logits
    assert torch.allclose(base, whole_block, atol=1e-4) and not torch.allclose(base, one, atol=1e-2)
