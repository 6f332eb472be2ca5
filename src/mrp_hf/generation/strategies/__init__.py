from .base import BlockDecoder, RevealStrategy, StepwiseDecoder, confidence_ranks, top_k_positions
from .direct import DirectDecoder
from .dynamic import DynamicStrategy
from .graph import GraphSpeculativeDecoder
from .remask import RemaskDecoder
from .speculative import SpeculativeDecoder
from .static import StaticStrategy, reveal_schedule

__all__ = [
    "BlockDecoder",
    "DirectDecoder",
    "DynamicStrategy",
    "GraphSpeculativeDecoder",
    "RemaskDecoder",
    "RevealStrategy",
    "SpeculativeDecoder",
    "StaticStrategy",
    "StepwiseDecoder",
    "confidence_ranks",
    "reveal_schedule",
    "top_k_positions",
]
