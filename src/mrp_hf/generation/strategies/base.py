"""What a reveal strategy is: given per-position confidences, decide which masked positions to commit."""

from __future__ import annotations

import torch


class RevealStrategy:
    """Decides, for one denoising step of one block, which masked positions are revealed.

    `select` sees only confidences (with -inf at positions that are not masked) and the step index; the
    proposed tokens come from the `TokenProposer`. Strategies never see the model.
    """

    def select(self, confidence: torch.Tensor, masked: torch.Tensor, step: int) -> torch.Tensor:
        """confidence, masked: [n, L]. Returns a bool [n, L] of positions to reveal (a subset of `masked`)."""
        raise NotImplementedError


def top_k_positions(confidence: torch.Tensor, masked: torch.Tensor, k: torch.Tensor | int) -> torch.Tensor:
    """The k most confident masked positions per row; ties go to the leftmost position (stable sort)."""
    order = torch.sort(confidence, dim=-1, descending=True, stable=True).indices
    ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))
    k = torch.as_tensor(k, device=confidence.device).reshape(-1, 1) if not isinstance(k, int) else k
    return (ranks < k) & masked
