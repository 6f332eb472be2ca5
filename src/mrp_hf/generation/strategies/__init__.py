from .base import BlockDecoder, RevealStrategy, StepwiseDecoder, top_k_positions
from .direct import DirectDecoder
from .dynamic import DynamicStrategy
from .remask import RemaskDecoder
from .speculative import SpeculativeDecoder
from .static import StaticStrategy, reveal_schedule

__all__ = [
    "DirectDecoder",
    "RemaskDecoder",
    "SpeculativeDecoder",
    "BlockDecoder",
    "StepwiseDecoder","DynamicStrategy", "RevealStrategy", "StaticStrategy", "reveal_schedule", "top_k_positions"]
