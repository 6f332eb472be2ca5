"""`load_backbone`: load a DLM by Hub id or local path, with the family's compatibility needs handled."""

from __future__ import annotations

from typing import Any

import torch
import transformers
from packaging import version
from transformers import AutoConfig
from transformers.utils import logging

from .._compat import IS_TRANSFORMERS_5, TRANSFORMERS_VERSION, accept_4x_generation_config_validate
from .registry import resolve_adapter_class

logger = logging.get_logger(__name__)

# Auto classes tried, in order, among those a remote-code repo's `auto_map` names.
_AUTO_PREFERENCE = ("AutoModelForMaskedLM", "AutoModelForCausalLM", "AutoModel")
# `from_pretrained` keyword arguments that say where the files are: the config and the tokenizer need them too
_HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "proxies", "token")
# transformers 4.56 renamed `torch_dtype` to `dtype` (the old name still works there, with a warning)
_DTYPE_KWARG = "dtype" if TRANSFORMERS_VERSION >= version.parse("4.56") else "torch_dtype"


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
        # 5.x moves partial_rotary_factor (like rope_theta) into rope_parameters and drops the attribute
        dim = int(head_dim * params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)))
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim))
        return inv_freq, 1.0

    modeling_rope_utils.ROPE_INIT_FUNCTIONS["default"] = default_rope


def _reinit_rope_buffers(model) -> None:
    """Recompute the rotary `inv_freq` buffers of 4.x-era remote code after a transformers 5.x load.

    5.x builds the model on the meta device and then gives every non-persistent buffer `torch.empty`
    storage, re-initialising only what the model's `_init_weights` covers. Remote code written for 4.x
    (Dream, SDAR, Fast-dLLM v2, LLaDA2: Qwen2/Qwen3-style rotary embeddings) computes `inv_freq` in
    `__init__` and its `_init_weights` never touches it, so it would hold uninitialised memory. We
    recompute it with the module's own `rope_init_fn`, exactly as its `__init__` did.
    """
    for module in model.modules():
        init_fn = getattr(module, "rope_init_fn", None)
        inv_freq = module._buffers.get("inv_freq")
        if not callable(init_fn) or inv_freq is None or getattr(module, "config", None) is None:
            continue
        value, scaling = init_fn(module.config, inv_freq.device, **(getattr(module, "rope_kwargs", None) or {}))
        with torch.no_grad():
            inv_freq.copy_(value.to(inv_freq.dtype))
        module.attention_scaling = scaling
        original = module._buffers.get("original_inv_freq")
        if original is not None:
            with torch.no_grad():
                original.copy_(value.to(original.dtype))
        elif hasattr(module, "original_inv_freq"):
            module.original_inv_freq = inv_freq


def _import_remote_code(path: str, config, revision: str | None, hub_kwargs: dict[str, Any]) -> None:
    """Import the model class the config's `auto_map` names (as `from_pretrained` is about to), so that the
    compatibility fixes can see its module before it runs; transformers keeps the module for the load."""
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    reference = (getattr(config, "auto_map", None) or {}).get(_auto_class(config).__name__)
    if reference:
        get_class_from_dynamic_module(reference, path, revision=revision, **hub_kwargs)


def _tokenizer_mask_id(path: str, revision: str | None, trust_remote_code: bool, **hub_kwargs: Any) -> int | None:
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            path, revision=revision, trust_remote_code=trust_remote_code, **hub_kwargs
        )
    except Exception:  # no tokenizer saved beside the model is fine: the mask id may come from the config
        return None
    return getattr(tokenizer, "mask_token_id", None)


def _saved_generation_config(path: str, revision: str | None, **hub_kwargs: Any):
    """The `generation_config.json` saved beside a backbone, or None when there is none."""
    try:
        return transformers.GenerationConfig.from_pretrained(path, revision=revision, **hub_kwargs)
    except OSError:
        return None


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
    hub_kwargs = {k: kwargs[k] for k in _HUB_KWARGS if k in kwargs}
    config_kwargs = dict(hub_kwargs, **({"subfolder": kwargs["subfolder"]} if "subfolder" in kwargs else {}))
    config = AutoConfig.from_pretrained(
        pretrained_model_name_or_path, trust_remote_code=trust_remote_code, revision=revision, **config_kwargs
    )
    adapter_cls = resolve_adapter_class(config, backbone_family)
    remote = bool(getattr(config, "auto_map", None)) and trust_remote_code
    if IS_TRANSFORMERS_5 and remote:
        _register_default_rope()
        _import_remote_code(pretrained_model_name_or_path, config, revision, hub_kwargs)
        accept_4x_generation_config_validate()
    load_kwargs: dict[str, Any] = dict(kwargs, trust_remote_code=trust_remote_code, revision=revision, config=config)
    if torch_dtype is not None:
        load_kwargs[_DTYPE_KWARG] = torch_dtype
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
    if IS_TRANSFORMERS_5 and remote:
        _reinit_rope_buffers(model)
    if getattr(model, "generation_config", None) is None:
        # transformers 5 attaches generation_config.json only to models that can generate(); ours decodes them
        model.generation_config = _saved_generation_config(pretrained_model_name_or_path, revision, **config_kwargs)
    model.eval()
    if not return_mask_token_id:
        return model
    return model, _tokenizer_mask_id(pretrained_model_name_or_path, revision, trust_remote_code, **hub_kwargs)
