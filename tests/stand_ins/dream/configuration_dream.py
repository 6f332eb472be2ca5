"""Tiny stand-in for the Dream configuration (Dream-org/Dream-v0-*-7B, apple/DiffuCoder-7B-*).

Written for the mrp-hf tests: same ``model_type`` ("Dream") and Qwen2-style field
names as the Hub config, ``mask_token_id`` stored in the config.
"""

from transformers import PretrainedConfig


class DreamConfig(PretrainedConfig):
    model_type = "Dream"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(
        self,
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_act="silu",
        max_position_embeddings=256,
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        use_cache=False,
        tie_word_embeddings=False,
        rope_theta=10000.0,
        rope_scaling=None,
        attention_dropout=0.0,
        mask_token_id=126,
        pad_token_id=125,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        self.rope_theta = rope_theta
        if rope_scaling is not None:  # (transformers 5 warns on any rope_scaling attribute)
            self.rope_scaling = rope_scaling
        self.attention_dropout = attention_dropout
        self.mask_token_id = mask_token_id
        kwargs.setdefault("bos_token_id", 125)
        kwargs.setdefault("eos_token_id", 125)
        kwargs.setdefault("architectures", ["DreamModel"])
        super().__init__(pad_token_id=pad_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs)
