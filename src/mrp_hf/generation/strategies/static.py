"""Static regime: a fixed number of reveals per step, most confident first ("low-confidence remasking")."""

from __future__ import annotations

import torch

from .base import RevealStrategy, top_k_positions


def reveal_schedule(block_length: int, steps_per_block: int) -> list[int]:
    """Tokens revealed at each step of a block: as even as possible, the remainder in the first steps."""
    base, extra = divmod(block_length, steps_per_block)
    return [base + (1 if step < extra else 0) for step in range(steps_per_block)]


def dream_reveal_count(masked: torch.Tensor, step: int, steps: int, eps: float = 1e-3) -> torch.Tensor:
    """Tokens Dream's `diffusion_generate` reveals per row at `step` of `steps`: with timesteps t = linspace(1, eps,
    steps + 1) (float32), int(M * (1 - t[step+1] / t[step])) for M masks left, and every remaining mask at the last
    step. Early steps may reveal nothing (with steps = answer length: 0 at the first step, 2 at the last)."""
    left = masked.sum(dim=-1)
    if step >= steps - 1:
        return left
    timesteps = torch.linspace(1, eps, steps + 1)
    ratio = 1 - timesteps[step + 1] / timesteps[step]
    return (left.float() * ratio.to(left.device)).to(torch.long)


class StaticStrategy(RevealStrategy):
    """Either `tokens_per_step` reveals per step, or a block's tokens spread over `steps_per_block` steps:
    evenly (`schedule="even"`, the remainder in the first steps: LLaDA's and SDAR's schedules) or by Dream's
    timestep schedule (`schedule="dream"`, `dream_reveal_count`)."""

    def __init__(self, tokens_per_step: int | None = None, steps_per_block: int | None = None, schedule: str = "even"):
        if tokens_per_step is not None and steps_per_block is not None:
            raise ValueError("give tokens_per_step or steps_per_block, not both")
        if tokens_per_step is None and steps_per_block is None:
            tokens_per_step = 1
        if schedule == "dream" and steps_per_block is None:
            raise ValueError("schedule='dream' spreads a block over a number of steps: pass steps.")
        self.tokens_per_step = tokens_per_step
        self.steps_per_block = steps_per_block
        self.schedule_name = schedule
        self.may_reveal_nothing = schedule == "dream"

    def schedule(self, block_length: int) -> list[int]:
        if self.steps_per_block is not None:
            return reveal_schedule(block_length, min(self.steps_per_block, block_length))
        return reveal_schedule(block_length, -(-block_length // self.tokens_per_step))

    def select(self, confidence: torch.Tensor, masked: torch.Tensor, step: int) -> torch.Tensor:
        if self.schedule_name == "dream":
            return top_k_positions(confidence, masked, dream_reveal_count(masked, step, self.steps_per_block))
        schedule = self.schedule(masked.shape[-1])
        return top_k_positions(confidence, masked, schedule[min(step, len(schedule) - 1)])
