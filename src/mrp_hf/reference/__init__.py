"""The project's own small reference DLM: model, tokenizer, synthetic tasks, and the bundled checkpoints.

Importing this package registers `ReferenceDLMConfig` / `ReferenceDLM` with the Auto classes, so the bundled
folders (and any saved copy) load with `AutoModelForMaskedLM.from_pretrained` or `mrp_hf.load_backbone`.
"""

from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM

from .bundled import load_reference
from .configuration_reference import ReferenceDLMConfig
from .modeling_reference import ReferenceDLM
from .tasks import TASKS, ReferenceItem, check_answer, held_out_items
from .tokenizer import build_tokenizer

AutoConfig.register(ReferenceDLMConfig.model_type, ReferenceDLMConfig, exist_ok=True)
AutoModel.register(ReferenceDLMConfig, ReferenceDLM, exist_ok=True)
AutoModelForMaskedLM.register(ReferenceDLMConfig, ReferenceDLM, exist_ok=True)

__all__ = [
    "TASKS",
    "ReferenceDLM",
    "ReferenceDLMConfig",
    "ReferenceItem",
    "build_tokenizer",
    "check_answer",
    "held_out_items",
    "load_reference",
]
