from .base import BlockDecoder, RevealStrategy, StepwiseDecoder, top_k_positions
from .dynamic import DynamicStrategy
from .static import StaticStrategy, reveal_schedule

__all__ = [
    "BlockDecoder",
    "StepwiseDecoder","DynamicStrategy", "RevealStrategy", "StaticStrategy", "reveal_schedule", "top_k_positions"]
