"""Reveal strategies (which masked positions a step reveals) and block decoders (how a block gets filled).

A `RevealStrategy` sees only confidences; a `BlockDecoder` fills one block through a `BlockContext`
(`generation/block.py`), the narrow interface to the backbone, the keyed proposals and the stats.
"""

from __future__ import annotations

import torch

from ..block import BlockContext


class RevealStrategy:
    """Decides, for one denoising step of one block, which masked positions are revealed.

    `select` sees only confidences (with -inf at positions that are not masked) and the step index; the
    proposed tokens come from the `TokenProposer`. Strategies never see the model. A strategy whose schedule
    has steps that reveal nothing (Dream's) sets `may_reveal_nothing`; otherwise a step that reveals nothing
    for a row with masked positions is an error (it would loop forever).
    """

    may_reveal_nothing: bool = False

    def select(self, confidence: torch.Tensor, masked: torch.Tensor, step: int) -> torch.Tensor:
        """confidence, masked: [n, L]. Returns a bool [n, L] of positions to reveal (a subset of `masked`)."""
        raise NotImplementedError


def confidence_ranks(confidence: torch.Tensor) -> torch.Tensor:
    """Rank of each position in its row, 0 = most confident; ties go to the leftmost position (stable sort)."""
    order = torch.sort(confidence, dim=-1, descending=True, stable=True).indices
    return torch.empty_like(order).scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))


def top_k_positions(confidence: torch.Tensor, masked: torch.Tensor, k: torch.Tensor | int) -> torch.Tensor:
    """The k most confident masked positions per row; ties go to the leftmost position (stable sort)."""
    if isinstance(k, int) and k == 1:  # argmax returns the first maximum, as the stable sort would
        return torch.zeros_like(masked).scatter_(-1, confidence.argmax(dim=-1, keepdim=True), True) & masked
    k = torch.as_tensor(k, device=confidence.device).unsqueeze(-1) if not isinstance(k, int) else k
    return (confidence_ranks(confidence) < k) & masked


def commit_exact_step(block: BlockContext, logits: torch.Tensor, select) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The base decoding's own step on the current state, from its exact `logits`: propose, `select(confidence,
    masked)` the positions to reveal, commit them. One read of the device (whether a row stalled, the most masked
    positions any row has left). Returns (ids [n, L], committed [n], masked [n, L], left) after the step; the
    speculative decoders draft from there."""
    ids = block.ids()
    masked = ids == block.mask_id
    committed = block.committed
    tokens, confidence = block.propose(logits, masked, committed)
    step = select(confidence, masked)
    stalled = masked.any(dim=1) & ~step.any(dim=1)
    ids = torch.where(step, tokens, ids)
    block.commit(ids, step.sum(dim=1))
    committed = committed + step.sum(dim=1)
    masked = masked & ~step
    any_stalled, left = torch.stack([stalled.any().long(), masked.sum(dim=1).max()]).tolist()
    if any_stalled:
        block.raise_if_stalled(stalled, confidence)
    return ids, committed, masked, left


class BlockDecoder:
    """Fills one block of every active row through a `BlockContext`; the plain decoder below alternates one
    backbone forward and one reveal decision, the MRP modes replace it."""

    def decode_block(self, block: BlockContext) -> None:
        raise NotImplementedError

    @staticmethod
    def forward_steps(block: BlockContext):
        """While a row still has masked positions in the block: one backbone forward (with the lm_head's input)
        per step. Yields (step, block ids [n, L], masked [n, L], BackboneOutput); the caller commits."""
        step = 0
        while True:
            ids = block.ids()
            masked = ids == block.mask_id
            if not bool(masked.any()):
                return
            yield step, ids, masked, block.forward(hidden=True)
            step += 1


class StepwiseDecoder(BlockDecoder):
    """The backbone's own decoding: per step, a. one forward, b. proposals, c. the strategy's reveals.

    One read of the device per step: whether a row stalled and whether masks remain are read together."""

    def __init__(self, strategy: RevealStrategy):
        self.strategy = strategy

    def decode_block(self, block: BlockContext) -> None:
        ids = block.ids()
        masked = ids == block.mask_id
        if not bool(masked.any()):
            return
        step = 0
        while True:
            has_work = masked.any(dim=1)
            # a. backbone forward
            logits = block.forward(has_work=has_work).logits
            # b. proposals
            tokens, confidence = block.propose(logits, masked)
            # c. reveal and commit
            reveal = self.strategy.select(confidence, masked, step)
            ids = torch.where(reveal, tokens, ids)
            block.commit(ids, reveal.sum(dim=1))
            masked = masked & ~reveal
            stalled = has_work & ~reveal.any(dim=1)
            if self.strategy.may_reveal_nothing:
                stalled = torch.zeros_like(stalled)
            any_stalled, any_left = torch.stack([stalled.any(), masked.any()]).tolist()
            if any_stalled:
                block.raise_if_stalled(stalled, confidence)
            if not any_left:
                return
            step += 1
