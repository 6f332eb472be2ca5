"""`mrp_mode="direct"` (lossy, for reference): K head steps per backbone forward reveal tokens themselves.

Per round: one backbone forward and its static pick (the most confident masked position), then K steps in
which the head's corrected logits lm_head(acc_k), acc_k = acc_{k-1} + h_C,k, pick the next position and
token with the same rule. 1 + K tokens per backbone forward; the head's mistakes are kept (no verify).
"""

from __future__ import annotations

import torch

from ..guard import HEAD_PART
from .base import BlockDecoder, top_k_positions


class DirectDecoder(BlockDecoder):
    def __init__(self, head, draft_tokens: int):
        self.head = head
        self.draft_tokens = draft_tokens

    @torch.no_grad()
    def decode_block(self, engine, state, start: int, end: int) -> None:
        embed, lm_head = engine.adapter.get_input_embeddings(), engine.adapter.get_output_embeddings()
        for _step, block, masked, out in self.forward_steps(engine, state, start, end):
            active = state.active
            logits, acc = out.logits, out.hidden_states
            positions = state.positions[active, start:end]
            for k in range(self.draft_tokens + 1):
                if k > 0:  # the head's prediction of the logits on the state after the last reveal
                    acc = acc + self.head(embed(block), acc, position_ids=positions)
                    logits = lm_head(acc)
                    state.guard.watch(HEAD_PART, logits)
                    state.stats.head_forwards += 1
                tokens, confidence = engine.propose(state, logits, start, end, masked, state.committed[active])
                pick = top_k_positions(confidence, masked, 1)
                block = torch.where(pick, tokens, block)
                masked = masked & ~pick
                state.committed[active] += pick.sum(dim=1)
                if not masked.any():
                    break
            state.canvas[active, start:end] = block
