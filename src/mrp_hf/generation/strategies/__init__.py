from .base import RevealStrategy, top_k_positions
from .dynamic import DynamicStrategy
from .static import StaticStrategy, reveal_schedule

__all__ = ["DynamicStrategy", "RevealStrategy", "StaticStrategy", "reveal_schedule", "top_k_positions"]
