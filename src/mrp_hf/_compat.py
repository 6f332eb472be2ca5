"""The few places where transformers 4.x and 5.x differ for this library, kept in one module."""

from __future__ import annotations

import torch
import transformers
from packaging import version

TRANSFORMERS_VERSION = version.parse(transformers.__version__)
IS_TRANSFORMERS_5 = TRANSFORMERS_VERSION.major >= 5


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
