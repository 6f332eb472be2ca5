"""mrp-hf: fast, better decoding for diffusion language models in Hugging Face transformers.

Importing the package is cheap: its public names are loaded on first use (PEP 562 `__getattr__`), and it imports
neither torch nor transformers. Importing it makes `AutoConfig`/`AutoModel` resolve MRP heads and the reference
DLM as soon as transformers loads its Auto classes (`mrp_hf/_auto.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _auto
from ._lazy import lazy_exports

__version__ = "0.1.0.dev0"

# public name -> the submodule that defines it
_EXPORTS = {
    "BackboneAdapter": "backbones",
    "available_families": "backbones",
    "get_adapter": "backbones",
    "load_backbone": "backbones",
    "register_adapter": "backbones",
    "MRPConfig": "configuration_mrp",
    "GenerationStats": "generation",
    "MRPGenerateOutput": "generation",
    "MRPGenerationConfig": "generation",
    "MRPHead": "modeling_mrp",
    "MRPModel": "modeling_mrp",
    "attach": "modeling_mrp",
    "ReferenceDLM": "reference",
    "ReferenceDLMConfig": "reference",
}

__all__ = [
    "BackboneAdapter",
    "GenerationStats",
    "MRPConfig",
    "MRPGenerateOutput",
    "MRPGenerationConfig",
    "MRPHead",
    "MRPModel",
    "ReferenceDLM",
    "ReferenceDLMConfig",
    "attach",
    "available_families",
    "get_adapter",
    "load_backbone",
    "register_adapter",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:  # for type checkers and IDEs: the real imports
    from .backbones import BackboneAdapter, available_families, get_adapter, load_backbone, register_adapter
    from .configuration_mrp import MRPConfig
    from .generation import GenerationStats, MRPGenerateOutput, MRPGenerationConfig
    from .modeling_mrp import MRPHead, MRPModel, attach
    from .reference import ReferenceDLM, ReferenceDLMConfig

_auto.install()
