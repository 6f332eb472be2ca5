"""The project's own small reference DLM: model, tokenizer, synthetic tasks, and the bundled checkpoints.

`import mrp_hf` registers `ReferenceDLMConfig` / `ReferenceDLM` with the Auto classes (`mrp_hf/_auto.py`), so the
bundled folders (and any saved copy) load with `AutoModelForMaskedLM.from_pretrained` or `mrp_hf.load_backbone`.
The names below load on first use, so that importing the config module alone stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {
    "load_reference": "bundled",
    "ReferenceDLMConfig": "configuration_reference",
    "ReferenceDLM": "modeling_reference",
    "TASKS": "tasks",
    "ReferenceItem": "tasks",
    "check_answer": "tasks",
    "held_out_items": "tasks",
    "build_tokenizer": "tokenizer",
}

__all__ = [
    "ReferenceDLM",
    "ReferenceDLMConfig",
    "ReferenceItem",
    "TASKS",
    "build_tokenizer",
    "check_answer",
    "held_out_items",
    "load_reference",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:
    from .bundled import load_reference
    from .configuration_reference import ReferenceDLMConfig
    from .modeling_reference import ReferenceDLM
    from .tasks import TASKS, ReferenceItem, check_answer, held_out_items
    from .tokenizer import build_tokenizer
