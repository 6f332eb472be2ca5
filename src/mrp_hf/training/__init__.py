"""Training an MRP head on a frozen diffusion LM backbone (see docs/training.md).

    from mrp_hf.training import MRPTrainingConfig, train_head
    head = train_head("GSAI-ML/LLaDA-8B-Instruct", "data.jsonl", "heads/llada-mrp",
                      config=MRPTrainingConfig(max_steps=2000, batch_size=4, trust_remote_code=True))
"""

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
    load_records,
    read_records,
    truncate,
)
from .objective import AgreementMeter, HeadChain, MRPObjective, Prepared, StepTargets, kl_per_position
from .trainer import TrainingInterrupted, train_head

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
    "TrainingDataError",
    "TrainingInterrupted",
    "kl_per_position",
    "load_records",
    "read_records",
    "train_head",
    "truncate",
]
