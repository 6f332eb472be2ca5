"""Dynamic regime: reveal every masked position whose confidence exceeds a threshold, at least one."""

from __future__ import annotations

import torch

from .base import RevealStrategy, top_k_positions


class DynamicStrategy(RevealStrategy):
    def __init__(self, threshold: float):
        self.threshold = float(threshold)

    def select(self, confidence: torch.Tensor, masked: torch.Tensor, step: int) -> torch.Tensor:
        above = (confidence > self.threshold) & masked
        # progress guard: the single most confident masked position is always revealed
        return above | top_k_positions(confidence, masked, 1)
