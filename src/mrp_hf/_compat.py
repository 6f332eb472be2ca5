"""The few places where transformers 4.x and 5.x differ for this library, kept in one module."""

from __future__ import annotations

from typing import Any

import torch
import transformers
from packaging import version

TRANSFORMERS_VERSION = version.parse(transformers.__version__)
IS_TRANSFORMERS_5 = TRANSFORMERS_VERSION.major >= 5
#: transformers 4.56 renamed `from_pretrained(torch_dtype=)` to `dtype` (the old name still works there, with a warning)
DTYPE_KWARG = "dtype" if TRANSFORMERS_VERSION >= version.parse("4.56") else "torch_dtype"


def output_with_cache(output_class, cache, **fields):
    """A model output carrying the KV cache under this transformers' field name (`cache` from 5.2x on, where
    `past_key_values=` still works but warns on every new process; `past_key_values` before)."""
    name = "cache" if "cache" in getattr(output_class, "__dataclass_fields__", {}) else "past_key_values"
    return output_class(**fields, **{name: cache})


def cache_length(cache) -> int:
    """Number of positions held by a `transformers` cache (0 for None)."""
    if cache is None:
        return 0
    return int(cache.get_seq_length())


def crop_cache(cache, length: int) -> None:
    """Drop cached positions beyond `length`.

    4.x's `DynamicCache.crop` takes the final length; 5.x's takes a negative count of positions to drop.
    Both accept a negative count, so that is what we pass.
    """
    excess = cache_length(cache) - length
    if excess < 0:
        raise ValueError(f"cannot crop a cache of {cache_length(cache)} positions to {length}")
    if excess > 0:
        cache.crop(-excess)


def select_cache_rows(cache, rows: torch.Tensor) -> None:
    """Keep only `rows` (batch indices) of a cache, in place."""
    if cache is not None and cache_length(cache) > 0:
        cache.batch_select_indices(rows)


def accept_4x_generation_config_validate() -> list[str]:
    """Let remote-code `GenerationConfig` subclasses written for transformers 4.x load under 5.x.

    5.x calls `validate(user_set_attributes=...)` from `GenerationConfig.from_dict`/`update`; Dream's
    `DreamGenerationConfig.validate(self, is_init=False)` (called by Dream's own `from_pretrained`) rejects the
    keyword with a TypeError. Every such class among the loaded remote modules (`transformers_modules.*`) gets a
    `validate` that passes on only the arguments the original accepts. Applied by `load_backbone`, only when it
    loads remote code under 5.x; returns the patched class names.
    """
    import inspect
    import sys

    from transformers import GenerationConfig

    patched = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("transformers_modules") or module is None:
            continue
        for value in list(vars(module).values()):
            if not (isinstance(value, type) and issubclass(value, GenerationConfig) and "validate" in vars(value)):
                continue
            original = vars(value)["validate"]
            if getattr(original, "_mrp_accepts_5x", False):
                continue
            parameters = inspect.signature(original).parameters
            if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
                continue
            value.validate = _validate_taking_only(original, set(parameters))
            patched.append(value.__name__)
    return patched


def _validate_taking_only(original, accepted: set[str]):
    def validate(self, *args, **kwargs):
        return original(self, *args, **{k: v for k, v in kwargs.items() if k in accepted})

    validate._mrp_accepts_5x = True
    validate.__wrapped__ = original
    return validate


def register_default_rope() -> None:
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


def reinit_rope_buffers(model) -> None:
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
