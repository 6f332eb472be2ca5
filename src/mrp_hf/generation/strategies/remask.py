"""`mrp_mode="remask"`: dynamic decoding whose over-eager reveals the head revokes.

Per step: one backbone forward; every masked position the backbone's own threshold rule reveals is proposed
(at least the most confident one), as in plain dynamic decoding; one head forward predicts how the logits
move once proposals are revealed; a proposal whose support collapses is revoked (it stays masked and is
decided in a later step). The head never commits a token the backbone did not propose.

What the head is conditioned on: a row's proposals are ranked by confidence, and proposal j is judged on the
state in which the proposals ranked above it are revealed and it is still masked. That is the state the
head is trained on (the backbone's state plus a few reveals, predicting the still-masked positions), and it
asks the question that matters: "once the surer proposals are in, does the backbone still want this token
here?" The stages of all rows go through ONE batched head forward (stacked in the batch, like the
speculative verifier's candidates). The top-ranked proposal has nothing above it and is never revoked, so a
step with a single proposal costs no head forward. Two published readings of "collapses" (`remask_rule`):
- "confidence" (default): the proposal's probability under the corrected logits A + C falls below the same
  threshold;
- "residual": |C[p, t]| > `remask_delta` for the proposed token t at p.
With an untrained head (C = 0) the "confidence" rule is exactly plain dynamic decoding.
"""

from __future__ import annotations

import torch

from ..block import BlockContext
from .base import BlockDecoder, confidence_ranks
from .dynamic import DynamicStrategy


class RemaskDecoder(BlockDecoder):
    def __init__(self, head, proposer_rule: DynamicStrategy, rule: str = "confidence", delta: float = 1.5):
        self.head = head
        self.proposer_rule = proposer_rule  # the family's own threshold rule (> or >=)
        self.threshold = proposer_rule.threshold
        self.rule = rule
        self.delta = float(delta)

    @torch.no_grad()
    def decode_block(self, block: BlockContext) -> None:
        for step, ids, masked, out in self.forward_steps(block):
            tokens, confidence = block.propose(out.logits, masked)
            proposed = self.proposer_rule.select(confidence, masked, step)
            revoked = self._revoked(block, ids, out, tokens, confidence, proposed)
            keep = proposed & ~revoked
            block.record_remask(proposed, revoked)
            block.commit(torch.where(keep, tokens, ids), keep.sum(dim=1))

    def _revoked(self, block: BlockContext, ids, out, tokens, confidence, proposed) -> torch.Tensor:
        """Bool [n, L]: the proposals the head revokes (never a row's top-ranked one)."""
        n, length = ids.shape
        stages = int(proposed.sum(dim=1).max())  # the head input's size depends on it: one read per step
        if stages <= 1:
            return torch.zeros_like(proposed)
        # rank of each proposal in its row (0 = most confident); non-proposals rank last
        rank = confidence_ranks(confidence.masked_fill(~proposed, float("-inf"))).masked_fill(~proposed, length)
        # stage j (1 .. stages-1) reveals the proposals ranked < j; stacked row-major: [n * (stages-1), L]
        j = torch.arange(1, stages, device=ids.device).view(1, -1, 1)
        staged_ids = torch.where(rank.unsqueeze(1) < j, tokens.unsqueeze(1), ids.unsqueeze(1)).reshape(-1, length)
        copies = stages - 1
        hidden = out.lm_head_input.repeat_interleave(copies, dim=0)
        positions = block.positions.repeat_interleave(copies, dim=0)
        h_c = self.head(block.embed(staged_ids), hidden, position_ids=positions)
        # each proposal reads the stage of its own rank: gather h_C [n, L, H] from [n, copies, L, H] before the
        # lm_head, so the vocabulary projection runs on one stage per position instead of every stage
        stage_of = (rank - 1).clamp(0, copies - 1)
        h_c = h_c.view(n, copies, length, -1).gather(1, stage_of[:, None, :, None].expand(-1, 1, -1, h_c.shape[-1])).squeeze(1)
        if self.rule == "confidence":
            corrected = block.lm_head(out.lm_head_input + h_c)
            block.head_forward_done(corrected)
            collapsed = block.confidence_of(corrected, tokens) < self.threshold
        else:
            residual = block.lm_head(h_c).float()  # C = lm_head(h_A + h_C) - lm_head(h_A) for a linear lm_head
            block.head_forward_done(residual)
            if getattr(block.lm_head, "bias", None) is not None:
                residual = residual - block.lm_head.bias.float()
            collapsed = residual.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).abs() > self.delta
        return proposed & (rank > 0) & collapsed
