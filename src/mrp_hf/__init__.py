"""mrp-hf: fast, better decoding for diffusion language models in Hugging Face transformers."""

from .backbones import BackboneAdapter, available_families, get_adapter, load_backbone, register_adapter
from .generation import GenerationStats, MRPGenerateOutput, MRPGenerationConfig
from .modeling_mrp import MRPModel

__version__ = "0.1.0.dev0"

__all__ = [
    "BackboneAdapter",
    "GenerationStats",
    "MRPGenerateOutput",
    "MRPGenerationConfig",
    "MRPModel",
    "available_families",
    "get_adapter",
    "load_backbone",
    "register_adapter",
]
