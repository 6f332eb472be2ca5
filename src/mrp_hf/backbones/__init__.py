"""Backbone adapters: one small file per DLM family, chosen by `get_adapter`."""

# Importing the family modules registers their adapters; generic last so that it is the fallback.
from . import (  # noqa: F401
    dream,
    fast_dllm_v2,
    generic,  # noqa: F401  (isort: keep after the families)
    llada,
    llada2,
    masked_lm,
    reference,
    sdar,
)
from .base import BackboneAdapter, BackboneOutput
from .loading import load_backbone
from .registry import available_families, get_adapter, register_adapter, resolve_adapter_class

__all__ = [
    "BackboneAdapter",
    "BackboneOutput",
    "available_families",
    "get_adapter",
    "load_backbone",
    "register_adapter",
    "resolve_adapter_class",
]
