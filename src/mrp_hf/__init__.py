"""mrp-hf: fast, better decoding for diffusion language models in Hugging Face transformers."""

from transformers import AutoConfig, AutoModel

from .backbones import BackboneAdapter, available_families, get_adapter, load_backbone, register_adapter
from .configuration_mrp import MRPConfig
from .generation import GenerationStats, MRPGenerateOutput, MRPGenerationConfig
from .modeling_mrp import MRPHead, MRPModel, attach
from .reference import ReferenceDLM, ReferenceDLMConfig

# `AutoConfig.from_pretrained(head_repo)` -> MRPConfig, `AutoModel.from_pretrained(head_repo)` -> MRPHead
AutoConfig.register(MRPConfig.model_type, MRPConfig, exist_ok=True)
AutoModel.register(MRPConfig, MRPHead, exist_ok=True)

__version__ = "0.1.0.dev0"

__all__ = [
    "BackboneAdapter",
    "GenerationStats",
    "MRPConfig",
    "MRPHead",
    "attach",
    "MRPGenerateOutput",
    "MRPGenerationConfig",
    "MRPModel",
    "ReferenceDLM",
    "ReferenceDLMConfig",
    "available_families",
    "get_adapter",
    "load_backbone",
    "register_adapter",
]
