"""`mrp_mode="remask"`: dynamic decoding whose over-eager reveals the head revokes.

Per step: one backbone forward; every masked position whose confidence exceeds `threshold` is proposed
(at least the most confident one), as in plain dynamic decoding; one head forward predicts how the logits
move once the proposals are revealed; a proposal whose support collapses is revoked (it stays masked and is
decided in a later step). The head never commits a token the backbone did not propose. Two published
readings of "collapses" (`remask_rule`):
- "confidence" (default): the proposed token's probability under the corrected logits A + C falls below
  the same threshold; the head sees the state with the proposals filled in;
- "residual": |C[p, t]| > `remask_delta` for proposed token t at p; the head runs on the pre-commit state.
Progress guard: if every proposal of a row is revoked, its safest one (highest corrected probability) stays.
With an untrained head (C = 0) the "confidence" rule is exactly plain dynamic decoding.
"""

from __future__ import annotations

import torch

from .base import BlockDecoder, top_k_positions
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
        embed, lm_head = engine.adapter.get_input_embeddings(), engine.adapter.get_output_embeddings()
        for step, block, masked, out in self.forward_steps(engine, state, start, end):
            active = state.active
            tokens, confidence = engine.propose(state, out.logits, start, end, masked, state.committed[active])
            proposed = self.proposer_rule.select(confidence, masked, step)
            # one head forward predicts the logits after the proposals are revealed
            head_ids = torch.where(proposed, tokens, block) if self.rule == "confidence" else block
            h_c = self.head(embed(head_ids), out.hidden_states, position_ids=state.positions[active, start:end])
            state.stats.head_forwards += 1
            if self.rule == "confidence":
                support = engine.confidence_of(state, lm_head(out.hidden_states + h_c), tokens, start, end)
                # (a lone below-threshold proposal, the dynamic rule's progress pick, is revoked here and
                # restored by the guard below)
                revoke = proposed & (support < self.threshold)
            else:
                residual = lm_head(h_c).float()  # C = lm_head(h_A + h_C) - lm_head(h_A) for a linear head
                if getattr(lm_head, "bias", None) is not None:
                    residual = residual - lm_head.bias.float()
                support = -residual.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).abs()
                revoke = proposed & (-support > self.delta)
            keep = proposed & ~revoke
            # progress guard: a row whose proposals were all revoked keeps its safest one
            empty = proposed.any(dim=1) & ~keep.any(dim=1)
            if empty.any():
                safest = top_k_positions(support.masked_fill(~proposed, float("-inf")), proposed, 1)
                keep = torch.where(empty.unsqueeze(1), safest, keep)
            state.stats.proposals += int(proposed.sum())
            state.stats.revoked_reveals += int((proposed & ~keep).sum())
            state.canvas[active, start:end] = torch.where(keep, tokens, block)
            state.committed[active] += keep.sum(dim=1)
