"""`load_backbone`: load a DLM by Hub id or local path, with the family's compatibility needs handled."""

from __future__ import annotations

from typing import Any

import torch
import transformers
from transformers import AutoConfig
from transformers.utils import logging

from .._compat import IS_TRANSFORMERS_5
from .registry import resolve_adapter_class

logger = logging.get_logger(__name__)

# Auto classes tried, in order, among those a remote-code repo's `auto_map` names.
_AUTO_PREFERENCE = ("AutoModelForMaskedLM", "AutoModelForCausalLM", "AutoModel")


def _auto_class(config) -> type:
    auto_map = getattr(config, "auto_map", None) or {}
    for name in _AUTO_PREFERENCE:
        if name in auto_map:
            return getattr(transformers, name)
    for arch in getattr(config, "architectures", None) or ():
        if arch.endswith("ForMaskedLM"):
            return transformers.AutoModelForMaskedLM
        if arch.endswith("ForCausalLM") or arch.endswith("LMHeadModel"):
            return transformers.AutoModelForCausalLM
    return transformers.AutoModelForMaskedLM


def _register_default_rope() -> None:
    """transformers 5.x dropped the "default" rope type that Dream's (and other Qwen2-era) remote code looks up.

    We register the plain RoPE frequencies under that name again: inv_freq[i] = theta^(-2i/d) over the
    rotary part of each head, with no attention scaling - the 4.x definition.
    """
    from transformers import modeling_rope_utils

    if "default" in modeling_rope_utils.ROPE_INIT_FUNCTIONS:
        return

    def default_rope(config=None, device=None, seq_len=None, **_: Any):
        params = getattr(config, "rope_parameters", None) or {}
        theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dim = int(head_dim * getattr(config, "partial_rotary_factor", 1.0))
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim))
        return inv_freq, 1.0

    modeling_rope_utils.ROPE_INIT_FUNCTIONS["default"] = default_rope


def _tokenizer_mask_id(path: str, revision: str | None, trust_remote_code: bool) -> int | None:
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code)
    except Exception:  # no tokenizer saved beside the model is fine: the mask id may come from the config
        return None
    return getattr(tokenizer, "mask_token_id", None)


def load_backbone(
    pretrained_model_name_or_path: str,
    backbone_family: str | None = None,
    trust_remote_code: bool = False,
    revision: str | None = None,
    torch_dtype: torch.dtype | str | None = None,
    device_map: Any = None,
    return_mask_token_id: bool = False,
    **kwargs: Any,
):
    """Load a diffusion LM backbone (in eval mode) from the Hub or a local folder.

    The family is detected from the config (or forced with `backbone_family`); families that cannot be
    decoded as masked diffusion are refused before any weight is loaded. `trust_remote_code` is passed
    through, never forced on. With `return_mask_token_id=True` also returns the tokenizer's mask token
    id (None if no tokenizer is saved there), for families whose config does not carry it.
    """
    config = AutoConfig.from_pretrained(pretrained_model_name_or_path, trust_remote_code=trust_remote_code, revision=revision)
    adapter_cls = resolve_adapter_class(config, backbone_family)
    remote = bool(getattr(config, "auto_map", None)) and trust_remote_code
    if IS_TRANSFORMERS_5 and remote:
        _register_default_rope()
    load_kwargs: dict[str, Any] = dict(kwargs, trust_remote_code=trust_remote_code, revision=revision, config=config)
    if torch_dtype is not None:
        load_kwargs["dtype" if IS_TRANSFORMERS_5 else "torch_dtype"] = torch_dtype
    if device_map is not None:
        load_kwargs["device_map"] = device_map
    try:
        model = _auto_class(config).from_pretrained(pretrained_model_name_or_path, **load_kwargs)
    except Exception as err:
        if not remote:
            raise
        raise RuntimeError(
            f"Loading {pretrained_model_name_or_path!r} ({adapter_cls.family} family) failed inside its remote code "
            f"under transformers {transformers.__version__}: {type(err).__name__}: {err}. "
            + (
                "Most Hub DLMs' remote code was written for transformers 4.x: install "
                "'transformers>=4.46,<5' (tested with 4.57.6) in this environment."
                if IS_TRANSFORMERS_5
                else "Check that the repo's remote code matches this transformers version."
            )
        ) from err
    model.eval()
    if not return_mask_token_id:
        return model
    return model, _tokenizer_mask_id(pretrained_model_name_or_path, revision, trust_remote_code)
