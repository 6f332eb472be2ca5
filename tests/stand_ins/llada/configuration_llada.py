"""Tiny stand-in for the LLaDA configuration (GSAI-ML/LLaDA-8B-Instruct, LLaDA-1.5).

Written for the mrp-hf tests. It keeps the public field names of the Hub config
(OLMo-style ``d_model`` / ``n_heads`` / ``n_layers``, read-only HF-style aliases,
``mask_token_id`` stored in the config) but none of the original code.
"""

from transformers import PretrainedConfig


class LLaDAConfig(PretrainedConfig):
    model_type = "llada"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(
        self,
        d_model=32,
        n_heads=4,
        n_kv_heads=None,
        n_layers=2,
        mlp_hidden_size=64,
        vocab_size=128,
        embedding_size=128,
        max_sequence_length=256,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        weight_tying=False,
        mask_token_id=126,
        use_cache=False,
        **kwargs,
    ):
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.n_layers = n_layers
        self.mlp_hidden_size = mlp_hidden_size
        self.vocab_size = vocab_size
        self.embedding_size = embedding_size
        self.max_sequence_length = max_sequence_length
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        self.weight_tying = weight_tying
        self.mask_token_id = mask_token_id
        self.use_cache = use_cache
        kwargs.setdefault("eos_token_id", 125)
        kwargs.setdefault("pad_token_id", 125)
        kwargs.setdefault("tie_word_embeddings", False)
        kwargs.setdefault("architectures", ["LLaDAModelLM"])
        super().__init__(**kwargs)

    # Like the Hub config, the HF-style names are read-only aliases.
    @property
    def hidden_size(self):
        return self.d_model

    @property
    def num_attention_heads(self):
        return self.n_heads

    @property
    def num_hidden_layers(self):
        return self.n_layers
