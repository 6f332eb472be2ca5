"""The reference DLM and its MRP head as shipped inside the package (`reference/checkpoints/`).

Regenerate them with `bash scripts/build_reference.sh` (docs/benchmarks.md says how long it takes).
"""

from __future__ import annotations

from pathlib import Path

CHECKPOINTS = Path(__file__).parent / "checkpoints"


def backbone_path() -> Path:
    return _existing(CHECKPOINTS / "backbone")


def head_path() -> Path:
    return _existing(CHECKPOINTS / "head")


def _existing(path: Path) -> Path:
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"The bundled reference checkpoint {path} is missing (an install without package data?); "
            f"rebuild it with `bash scripts/build_reference.sh` from a source checkout."
        )
    return path


def load_reference(with_head: bool = True):
    """(MRPModel, tokenizer) for the bundled reference DLM, with its MRP head unless `with_head=False`."""
    from transformers import AutoTokenizer

    from ..backbones import load_backbone
    from ..modeling_mrp import MRPModel

    backbone = load_backbone(str(backbone_path()))
    tokenizer = AutoTokenizer.from_pretrained(str(backbone_path()))
    if with_head:
        model = MRPModel.from_pretrained(str(head_path()), backbone=backbone)
    else:
        model = MRPModel.from_backbone(backbone)
    return model, tokenizer
