"""Dynamic regime: reveal every masked position whose confidence exceeds a threshold, at least one."""

from __future__ import annotations

import torch

from .base import RevealStrategy, top_k_positions


class DynamicStrategy(RevealStrategy):
    """`inclusive`: reveal confidence >= threshold (LLaDA's and Dream's code) instead of > (SDAR, Fast-dLLM v2,
    LLaDA2); the two differ only at confidences exactly equal to the threshold (e.g. 1.0 with threshold 1.0)."""

    def __init__(self, threshold: float, inclusive: bool = False):
        self.threshold = float(threshold)
        self.inclusive = inclusive

    def select(self, confidence: torch.Tensor, masked: torch.Tensor, step: int) -> torch.Tensor:
        above = (confidence >= self.threshold if self.inclusive else confidence > self.threshold) & masked
        # progress guard: the single most confident masked position is always revealed
        return above | top_k_positions(confidence, masked, 1)
