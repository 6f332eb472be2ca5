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
