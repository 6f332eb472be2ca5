"""Training an MRP head on a frozen diffusion LM backbone (see docs/training.md).

    from mrp_hf.training import MRPTrainingConfig, train_head
    head = train_head("GSAI-ML/LLaDA-8B-Instruct", "data.jsonl", "heads/llada-mrp",
                      config=MRPTrainingConfig(max_steps=2000, batch_size=4, trust_remote_code=True))

The names load on first use (PEP 562), so that `MRPTrainingConfig` (all `mrp-hf train --help` needs) comes
without torch, accelerate or the trainer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

# public name -> the submodule that defines it
_EXPORTS = {
    "NoSpaceLeftError": "checkpoint",
    "OutputExistsError": "checkpoint",
    "MRPTrainingConfig": "config",
    "EpochSampler": "data",
    "RecordTokenizer": "data",
    "Row": "data",
    "RowBuilder": "data",
    "RowCollator": "data",
    "Sample": "data",
    "TrainingDataError": "data",
    "read_records": "data",
    "truncate": "data",
    "AgreementMeter": "objective",
    "HeadChain": "objective",
    "MRPObjective": "objective",
    "Prepared": "objective",
    "StepTargets": "objective",
    "kl_per_position": "objective",
    "Trainer": "trainer",
    "TrainingInterrupted": "trainer",
    "train_head": "trainer",
}

__all__ = [
    "AgreementMeter",
    "EpochSampler",
    "HeadChain",
    "MRPObjective",
    "MRPTrainingConfig",
    "NoSpaceLeftError",
    "OutputExistsError",
    "Prepared",
    "RecordTokenizer",
    "Row",
    "RowBuilder",
    "RowCollator",
    "Sample",
    "StepTargets",
    "Trainer",
    "TrainingDataError",
    "TrainingInterrupted",
    "kl_per_position",
    "read_records",
    "train_head",
    "truncate",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:  # for type checkers and IDEs: the real imports
    from .checkpoint import NoSpaceLeftError, OutputExistsError
    from .config import MRPTrainingConfig
    from .data import (
        EpochSampler,
        RecordTokenizer,
        Row,
        RowBuilder,
        RowCollator,
        Sample,
        TrainingDataError,
        read_records,
        truncate,
    )
    from .objective import AgreementMeter, HeadChain, MRPObjective, Prepared, StepTargets, kl_per_position
    from .trainer import Trainer, TrainingInterrupted, train_head
