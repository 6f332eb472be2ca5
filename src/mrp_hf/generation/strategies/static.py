"""Static regime: a fixed number of reveals per step, most confident first ("low-confidence remasking")."""

from __future__ import annotations

import torch

from .base import RevealStrategy, top_k_positions


def reveal_schedule(block_length: int, steps_per_block: int) -> list[int]:
    """Tokens revealed at each step of a block: as even as possible, the remainder in the first steps."""
    base, extra = divmod(block_length, steps_per_block)
    return [base + (1 if step < extra else 0) for step in range(steps_per_block)]


class StaticStrategy(RevealStrategy):
    """Either `tokens_per_step` reveals per step, or a block's tokens spread over `steps_per_block` steps."""

    def __init__(self, tokens_per_step: int | None = None, steps_per_block: int | None = None):
        if tokens_per_step is not None and steps_per_block is not None:
            raise ValueError("give tokens_per_step or steps_per_block, not both")
        if tokens_per_step is None and steps_per_block is None:
            tokens_per_step = 1
        self.tokens_per_step = tokens_per_step
        self.steps_per_block = steps_per_block

    def schedule(self, block_length: int) -> list[int]:
        if self.steps_per_block is not None:
            return reveal_schedule(block_length, min(self.steps_per_block, block_length))
        return reveal_schedule(block_length, -(-block_length // self.tokens_per_step))

    def select(self, confidence: torch.Tensor, masked: torch.Tensor, step: int) -> torch.Tensor:
        schedule = self.schedule(masked.shape[-1])
        return top_k_positions(confidence, masked, schedule[min(step, len(schedule) - 1)])
