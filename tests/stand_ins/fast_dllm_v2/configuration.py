"""Tiny stand-in for the Fast-dLLM v2 configuration (Efficient-Large-Model/Fast_dLLM_v2_7B, _1.5B).

Written for the mrp-hf tests.  The Hub class is the Qwen2 config renamed to
``model_type = "Fast_dLLM_Qwen"`` plus ``bd_size`` (the block size used in
training).  The mask token (``|<MASK>|``) lives in the tokenizer only.
"""

from transformers import PretrainedConfig


class Fast_dLLM_QwenConfig(PretrainedConfig):
    model_type = "Fast_dLLM_Qwen"
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
        use_cache=True,
        tie_word_embeddings=False,
        rope_theta=10000.0,
        rope_scaling=None,
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=28,
        layer_types=None,
        attention_dropout=0.0,
        bd_size=32,
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
        if rope_scaling is not None:
            self.rope_scaling = rope_scaling
        self.use_sliding_window = use_sliding_window
        self.sliding_window = sliding_window
        self.max_window_layers = max_window_layers
        self.layer_types = layer_types or ["full_attention"] * num_hidden_layers
        self.attention_dropout = attention_dropout
        self.bd_size = bd_size
        kwargs.setdefault("bos_token_id", 125)
        kwargs.setdefault("eos_token_id", 125)
        kwargs.setdefault("architectures", ["Fast_dLLM_QwenForCausalLM"])
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
