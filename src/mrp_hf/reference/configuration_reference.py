"""`ReferenceDLMConfig`: the project's own small block-causal masked diffusion LM."""

from __future__ import annotations

from transformers import PretrainedConfig

from .._auto import register_models


class ReferenceDLMConfig(PretrainedConfig):
    """A small SDAR-style masked diffusion LM: causal across blocks of `block_size` tokens, bidirectional
    inside a block, with an exact prefix KV cache. The model builds its own attention pattern from a 2-D
    padding mask, so callers (and the engine) pass padding only.

    `attention="bidirectional"` makes every position see every other (a LLaDA-style variant); such a model
    has no exact cache.

    `block_position_embedding=True` adds a learned embedding of each position's index inside its block
    (position id modulo `block_size`) to the token embeddings: rotary positions are relative, and a deep
    model learns the block layout (where an answer block starts, where its EOS fill begins) faster with it.
    """

    model_type = "mrp_reference_dlm"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(
        self,
        vocab_size: int = 48,
        hidden_size: int = 128,
        intermediate_size: int = 384,
        num_hidden_layers: int = 4,
        num_attention_heads: int = 4,
        block_size: int = 8,
        attention: str = "block_causal",
        max_position_embeddings: int = 64,
        rope_theta: float = 10000.0,
        rms_norm_eps: float = 1e-6,
        initializer_range: float = 0.02,
        mask_token_id: int = 1,
        pad_token_id: int = 0,
        eos_token_id: int = 2,
        tie_word_embeddings: bool = False,
        block_position_embedding: bool = False,
        **kwargs,
    ):
        if attention not in ("block_causal", "bidirectional"):
            raise ValueError(f"attention={attention!r} must be 'block_causal' or 'bidirectional'.")
        if hidden_size % num_attention_heads:
            raise ValueError(f"hidden_size={hidden_size} is not a multiple of num_attention_heads={num_attention_heads}.")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.block_size = block_size
        self.attention = attention
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.mask_token_id = mask_token_id
        self.block_position_embedding = block_position_embedding
        super().__init__(
            pad_token_id=pad_token_id, eos_token_id=eos_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs
        )
        register_models()  # AutoModel / AutoModelForMaskedLM -> ReferenceDLM, now that a config exists
