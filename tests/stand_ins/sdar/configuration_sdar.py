"""Tiny stand-in for the SDAR configuration (JetLM/SDAR-1.7B-Chat, -4B-Chat, -8B-Chat, -*-bN).

Written for the mrp-hf tests.  The Hub class is the Qwen3 config renamed to
``model_type = "sdar"``.  Its ``__init__`` names neither the mask token id nor the
block size, but SDAR-4B-Chat's and SDAR-8B-Chat's ``config.json`` carry both
(``"block_size": 4``, ``"mask_token_id": 151669``), so they arrive through ``**kwargs``
and become attributes; the tokenizer also has the mask token (``<|MASK|>``).  The block
size is the one its training mask and ``generate.py`` use.
"""

from transformers import PretrainedConfig


class SDARConfig(PretrainedConfig):
    model_type = "sdar"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(
        self,
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        hidden_act="silu",
        max_position_embeddings=256,
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        use_cache=True,
        tie_word_embeddings=False,
        rope_theta=10000.0,
        rope_scaling=None,
        attention_bias=False,
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=28,
        attention_dropout=0.0,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        self.rope_theta = rope_theta
        if rope_scaling is not None:
            self.rope_scaling = rope_scaling
        self.attention_bias = attention_bias
        self.use_sliding_window = use_sliding_window
        self.sliding_window = sliding_window
        self.max_window_layers = max_window_layers
        self.attention_dropout = attention_dropout
        kwargs.setdefault("bos_token_id", 125)
        kwargs.setdefault("eos_token_id", 125)
        kwargs.setdefault("architectures", ["SDARForCausalLM"])
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
