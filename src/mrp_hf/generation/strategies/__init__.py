from .base import BlockDecoder, RevealStrategy, StepwiseDecoder, top_k_positions
from .dynamic import DynamicStrategy
from .speculative import SpeculativeDecoder
from .static import StaticStrategy, reveal_schedule

__all__ = [
    "SpeculativeDecoder",
    "BlockDecoder",
    "StepwiseDecoder","DynamicStrategy", "RevealStrategy", "StaticStrategy", "reveal_schedule", "top_k_positions"]
