"""Tiny stand-in for the LLaDA2 configuration (inclusionAI/LLaDA2.0-mini(-preview), -flash).

Written for the mrp-hf tests: same ``model_type`` ("llada2_moe") and field names as
the Hub config (Ling/Bailing MoE fields).  The Hub config class has no mask token
field; the id (156895, ``<|mask|>``) is a default argument of the Hub ``generate``
and a special token of the tokenizer.
"""

from transformers import PretrainedConfig


class LLaDA2MoeConfig(PretrainedConfig):
    model_type = "llada2_moe"

    def __init__(
        self,
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_act="silu",
        use_qkv_bias=False,
        use_qk_norm=True,
        use_bias=False,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        embedding_dropout=0.0,
        attention_dropout=0.0,
        output_dropout=0.0,
        initializer_range=0.02,
        max_position_embeddings=256,
        rope_theta=10000.0,
        use_cache=False,
        max_window_layers=28,
        rope_scaling=None,
        pad_token_id=125,
        num_experts=4,
        num_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        routed_scaling_factor=1.0,
        moe_intermediate_size=32,
        first_k_dense_replace=2,
        head_dim=None,
        output_router_logits=False,
        partial_rotary_factor=0.5,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.hidden_act = hidden_act
        self.use_qkv_bias = use_qkv_bias
        self.use_qk_norm = use_qk_norm
        self.use_bias = use_bias
        self.rms_norm_eps = rms_norm_eps
        self.embedding_dropout = embedding_dropout
        self.attention_dropout = attention_dropout
        self.output_dropout = output_dropout
        self.initializer_range = initializer_range
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.use_cache = use_cache
        self.max_window_layers = max_window_layers
        if rope_scaling is not None:
            self.rope_scaling = rope_scaling
        self.num_experts = num_experts
        self.num_shared_experts = num_shared_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.n_group = n_group
        self.topk_group = topk_group
        self.routed_scaling_factor = routed_scaling_factor
        self.moe_intermediate_size = moe_intermediate_size
        self.first_k_dense_replace = first_k_dense_replace
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.output_router_logits = output_router_logits
        self.partial_rotary_factor = partial_rotary_factor
        kwargs.setdefault("eos_token_id", 125)
        kwargs.setdefault("architectures", ["LLaDA2MoeModelLM"])
        super().__init__(pad_token_id=pad_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs)
