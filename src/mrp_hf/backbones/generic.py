"""Fallback adapter: any model with an input embedding, an lm_head and a mask token id (bidirectional)."""

from .base import BackboneAdapter
from .registry import register_adapter


@register_adapter
class GenericAdapter(BackboneAdapter):
    family = "generic"
