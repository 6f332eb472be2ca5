"""`MRPConfig`: the head's architecture plus everything needed to refuse a wrong backbone."""

from __future__ import annotations

from typing import Any

import torch
from transformers import PretrainedConfig

from ._auto import register_models
from .hub import AUTO_MAP

# Rows of the embedding / lm_head sampled by the fingerprint: spread over the vocabulary, fixed forever.
_FINGERPRINT_ROWS = 16
# Upper bounds of a head's sizes, far above any real head (the paper's heads have 2-3 layers of the backbone's
# width) and far below what would hang the loader.
_SIZE_LIMITS = {
    "hidden_size": 1 << 16,
    "head_hidden_size": 1 << 16,
    "num_hidden_layers": 64,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "intermediate_size": 1 << 19,
    "max_position_embeddings": 1 << 24,
}


class MRPConfig(PretrainedConfig):
    """Configuration of an MRP head (`model_type="mrp"`).

    Architecture:
        hidden_size: the backbone's hidden size (width of h_A, of the shared embedding and of h_C).
        head_hidden_size: width of the head's own layers (default: `hidden_size`); a narrower head adds a
            zero-initialised projection back to `hidden_size`.
        num_hidden_layers, num_attention_heads, num_key_value_heads, intermediate_size, rms_norm_eps,
        rope_theta, max_position_embeddings: the head's decoder layers (transformers' Llama layer).

    Backbone identity (checked when the head is attached):
        base_model_name_or_path, base_model_revision, peft_adapter_id: what to load when no backbone is given.
        backbone_family, vocab_size, mask_token_id, block_length (used in training), attention,
        backbone_fingerprint: statistics of sampled rows of the embedding and lm_head weights.
        training: free-form record of how the head was trained and its held-out metrics.
    """

    model_type = "mrp"

    def __init__(
        self,
        hidden_size: int = 4096,
        head_hidden_size: int | None = None,
        num_hidden_layers: int = 3,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        intermediate_size: int | None = None,
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 10000.0,
        max_position_embeddings: int = 8192,
        vocab_size: int | None = None,
        mask_token_id: int | None = None,
        base_model_name_or_path: str | None = None,
        base_model_revision: str | None = None,
        peft_adapter_id: str | None = None,
        backbone_family: str | None = None,
        block_length: int | None = None,
        attention: str = "bidirectional",
        backbone_fingerprint: list[float] | None = None,
        training: dict[str, Any] | None = None,
        **kwargs: Any,
    ):
        self.hidden_size = hidden_size
        self.head_hidden_size = head_hidden_size or hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.intermediate_size = intermediate_size or 4 * self.head_hidden_size
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.max_position_embeddings = max_position_embeddings
        self.vocab_size = vocab_size
        self.mask_token_id = mask_token_id
        self.base_model_name_or_path = base_model_name_or_path
        self.base_model_revision = base_model_revision
        self.peft_adapter_id = peft_adapter_id
        self.backbone_family = backbone_family
        self.block_length = block_length
        self.attention = attention
        self.backbone_fingerprint = backbone_fingerprint
        self.training = training or {}
        # transformers resolves a head folder through these (with trust_remote_code=True) without `import mrp_hf`;
        # the head's save_pretrained writes the code files they name (mrp_hf/hub.py)
        kwargs.setdefault("auto_map", dict(AUTO_MAP))
        super().__init__(**kwargs)
        self._check_sizes()
        register_models()  # AutoModel -> MRPHead, now that a config exists (mrp_hf/_auto.py)

    def _check_sizes(self) -> None:
        """Refuse sizes no head can have before anything is built: a config from an untrusted repo with
        `num_hidden_layers=10**6` would otherwise spend minutes constructing layers (even on the meta device)."""
        for name, limit in _SIZE_LIMITS.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
                raise ValueError(
                    f"MRPConfig.{name}={value!r} is outside [1, {limit}]: this is not an MRP head config (heads "
                    f"have 1-8 layers and the backbone's width); check the head's config.json."
                )
        if self.head_hidden_size % self.num_attention_heads:
            raise ValueError(
                f"head_hidden_size={self.head_hidden_size} is not divisible by num_attention_heads="
                f"{self.num_attention_heads}; pick a head count that divides it."
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of num_key_value_heads="
                f"{self.num_key_value_heads}."
            )
        if self.vocab_size is not None and (not isinstance(self.vocab_size, int) or self.vocab_size < 1):
            raise ValueError(f"MRPConfig.vocab_size={self.vocab_size!r} must be a positive int or None.")

    @classmethod
    def register_for_auto_class(cls, auto_class="AutoConfig") -> None:
        """Does nothing: `auto_map` is set by `__init__` and the code files are written by the head's
        `save_pretrained`. transformers calls this after loading the class through `auto_map`; registering would
        make the next `save_pretrained` copy mrp-hf's own source file into the folder."""

    @classmethod
    def for_backbone(cls, adapter, base_model_name_or_path: str | None = None, **overrides: Any) -> MRPConfig:
        """A head config matched to a backbone (through its adapter): identity fields filled in, the head's
        width and head count taken from the backbone unless overridden."""
        bconf = adapter.config
        heads = overrides.pop("num_attention_heads", None) or getattr(bconf, "num_attention_heads", None) or 8
        width = overrides.pop("head_hidden_size", None) or adapter.hidden_size
        if width % heads:
            heads = next(h for h in range(min(heads, width), 0, -1) if width % h == 0)
        fields: dict[str, Any] = {
            "hidden_size": adapter.hidden_size,
            "head_hidden_size": width,
            "num_attention_heads": heads,
            "num_key_value_heads": heads,
            "intermediate_size": getattr(bconf, "intermediate_size", None) if width == adapter.hidden_size else None,
            "rms_norm_eps": float(getattr(bconf, "rms_norm_eps", 1e-6) or 1e-6),
            "rope_theta": float(getattr(bconf, "rope_theta", 10000.0) or 10000.0),
            "max_position_embeddings": adapter.max_positions or 8192,
            "vocab_size": adapter.vocab_size,
            "mask_token_id": adapter.mask_token_id,
            "base_model_name_or_path": base_model_name_or_path or getattr(bconf, "_name_or_path", None) or None,
            "backbone_family": adapter.family,
            "attention": adapter.attention_pattern,
            "backbone_fingerprint": backbone_fingerprint(adapter),
        }
        fields.update(overrides)
        return cls(**fields)


@torch.no_grad()
def backbone_fingerprint(adapter) -> list[float]:
    """Fixed sampled entries of the input embedding and the lm_head weights.

    16 entries per matrix, at rows spread over the vocabulary. Compared with a 1% relative tolerance, they
    survive a bf16 load of an fp32 checkpoint (0.4% rounding at most) and device placement, but tell apart
    backbones whose shared weights differ (another checkpoint or a full fine-tune).
    """
    values: list[float] = []
    for module in (adapter.get_input_embeddings(), adapter.get_output_embeddings()):
        weight = module.weight
        rows = torch.linspace(0, weight.shape[0] - 1, _FINGERPRINT_ROWS).long()
        cols = (rows * 7919) % weight.shape[1]
        values += [float(f"{float(weight[int(r), int(c)]):.6g}") for r, c in zip(rows, cols, strict=True)]
    return values


def fingerprints_match(expected: list[float], actual: list[float], rel_tol: float = 1e-2, abs_tol: float = 1e-6) -> bool:
    if len(expected) != len(actual):
        return False
    return all(abs(a - b) <= abs_tol + rel_tol * abs(a) for a, b in zip(expected, actual, strict=True))
