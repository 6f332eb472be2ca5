"""`mrp_mode="direct"` (lossy, for reference): K head steps per backbone forward reveal tokens themselves.

Per round: one backbone forward and its static pick (the most confident masked position), then K steps in
which the head's corrected logits lm_head(acc_k), acc_k = acc_{k-1} + h_C,k, pick the next position and
token with the same rule. 1 + K tokens per backbone forward; the head's mistakes are kept (no verify).
"""

from __future__ import annotations

import torch

from ..block import BlockContext
from .base import BlockDecoder, top_k_positions


class DirectDecoder(BlockDecoder):
    def __init__(self, head, draft_tokens: int):
        self.head = head
        self.draft_tokens = draft_tokens

    @torch.no_grad()
    def decode_block(self, block: BlockContext) -> None:
        positions = block.positions
        for _step, ids, masked, out in self.forward_steps(block):
            logits, acc = out.logits, out.lm_head_input
            committed = block.committed
            for k in range(self.draft_tokens + 1):
                if k > 0:  # the head's prediction of the logits on the state after the last reveal
                    if not bool(masked.any()):
                        break
                    acc = acc + self.head(block.embed(ids), acc, position_ids=positions)
                    logits = block.lm_head(acc)
                    block.head_forward_done(logits)
                tokens, confidence = block.propose(logits, masked, committed)
                pick = top_k_positions(confidence, masked, 1)
                ids = torch.where(pick, tokens, ids)
                masked = masked & ~pick
                committed = committed + pick.sum(dim=1)
            block.commit(ids, committed - block.committed)
