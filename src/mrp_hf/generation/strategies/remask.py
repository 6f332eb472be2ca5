"""`mrp_mode="remask"`: dynamic decoding whose over-eager reveals the head revokes.

Per step: one backbone forward; every masked position whose confidence exceeds `threshold` is proposed
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

from ..guard import HEAD_PART
from .base import BlockDecoder, confidence_ranks
from .dynamic import DynamicStrategy


class RemaskDecoder(BlockDecoder):
    def __init__(self, head, threshold: float, rule: str = "confidence", delta: float = 1.5):
        self.head = head
        self.threshold = float(threshold)
        self.rule = rule
        self.delta = float(delta)
        self.proposer_rule = DynamicStrategy(threshold)

    @torch.no_grad()
    def decode_block(self, engine, state, start: int, end: int) -> None:
        for step, block, masked, out in self.forward_steps(engine, state, start, end):
            active = state.active
            tokens, confidence = engine.propose(state, out.logits, start, end, masked, state.committed[active])
            proposed = self.proposer_rule.select(confidence, masked, step)
            keep = proposed & ~self._revoked(engine, state, start, end, block, out, tokens, confidence, proposed)
            state.stats.proposals += int(proposed.sum())
            state.stats.revoked_reveals += int((proposed & ~keep).sum())
            state.canvas[active, start:end] = torch.where(keep, tokens, block)
            state.committed[active] += keep.sum(dim=1)

    def _revoked(self, engine, state, start, end, block, out, tokens, confidence, proposed) -> torch.Tensor:
        """Bool [n, L]: the proposals the head revokes (never a row's top-ranked one)."""
        n, length = block.shape
        stages = int(proposed.sum(dim=1).max())
        if stages <= 1:
            return torch.zeros_like(proposed)
        # rank of each proposal in its row (0 = most confident); non-proposals rank last
        rank = confidence_ranks(confidence.masked_fill(~proposed, float("-inf")))
        rank = rank.masked_fill(~proposed, length)
        # stage j (1 .. stages-1) reveals the proposals ranked < j; stacked row-major: [n * (stages-1), L]
        j = torch.arange(1, stages, device=block.device).view(1, -1, 1)
        revealed = rank.unsqueeze(1) < j
        staged_ids = torch.where(revealed, tokens.unsqueeze(1), block.unsqueeze(1)).reshape(-1, length)
        copies = stages - 1
        hidden = out.hidden_states.repeat_interleave(copies, dim=0)
        positions = state.positions[state.active, start:end].repeat_interleave(copies, dim=0)
        embed, lm_head = engine.adapter.get_input_embeddings(), engine.adapter.get_output_embeddings()
        h_c = self.head(embed(staged_ids), hidden, position_ids=positions)
        state.stats.head_forwards += 1
        # each proposal reads the stage of its own rank: gather h_C [n, L, H] from [n, copies, L, H] before the
        # lm_head, so the vocabulary projection runs on one stage per position instead of every stage
        stage_of = (rank - 1).clamp(0, copies - 1)
        h_c = h_c.view(n, copies, length, -1).gather(1, stage_of[:, None, :, None].expand(-1, 1, -1, h_c.shape[-1])).squeeze(1)
        if self.rule == "confidence":
            corrected = lm_head(out.hidden_states + h_c)
            state.guard.watch(HEAD_PART, corrected)
            support = engine.confidence_of(state, corrected, tokens, start, end)
            collapsed = support < self.threshold
        else:
            residual = lm_head(h_c).float()  # C = lm_head(h_A + h_C) - lm_head(h_A) for a linear lm_head
            state.guard.watch(HEAD_PART, residual)
            if getattr(lm_head, "bias", None) is not None:
                residual = residual - lm_head.bias.float()
            collapsed = residual.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).abs() > self.delta
        return proposed & (rank > 0) & collapsed
