"""`mrp_mode="speculative"`: lossless MRP decoding in the static regime (one exact token per step).

One round, from exact backbone logits on the current state S:
1. the backbone's own pick on S (most confident masked position, its token) is exact: commit it -> S_1;
2. drafting: the head, applied recurrently on the hidden-state accumulator, predicts the logits of
   S_1, S_2, ... and proposes the pick d_k on each S_k -> S_{k+1} = S_k + d_k (no backbone forward);
3. verification: ONE backbone forward over the candidate states S_1 .. S_{K+1} (stacked in the batch or packed
   in one sequence per row, `verify_layout`: generation/packed.py); d_k is accepted iff the backbone's pick on
   S_k is d_k (same position, same token), for all k at once; each row keeps its own longest accepted prefix,
   and the verify outputs of the state it stops at are the exact outputs of the next round. When the drafts
   fill the block, the state that fills it also reads the next block (still masked) in the same forward: if the
   row ends its block there, those outputs are the next block's first (`BlockContext.verify`, `carry`).
Picks are made by the same `TokenProposer` as static decoding, with the same committed count, so the keyed
random draws coincide and the output equals static decoding token for token, greedy or sampled.
One read of the device per round: whether a row stalled, and how many masked positions are left.
"""

from __future__ import annotations

import torch

from ..block import BlockContext
from .base import BlockDecoder, commit_exact_step, top_k_positions


class SpeculativeDecoder(BlockDecoder):
    def __init__(self, head, draft_tokens: int):
        if draft_tokens < 1:
            raise ValueError(f"mrp_draft_tokens={draft_tokens} must be >= 1.")
        self.head = head
        self.draft_tokens = draft_tokens

    @torch.no_grad()
    def decode_block(self, block: BlockContext) -> None:
        exact = block.first_forward(hidden=True)  # the backbone's own outputs on the current state S
        while True:
            # 1. the exact pick on S
            ids, committed, masked, left = commit_exact_step(
                block, exact.logits, lambda confidence, open_: top_k_positions(confidence, open_, 1)
            )
            if left == 0:
                return
            # 2. drafts from the head (no more than the masked positions left)
            states, drafts = self._draft(block, ids, masked, committed, exact.lm_head_input, min(self.draft_tokens, left))
            # 3. one backbone forward verifies S_1 .. S_k+1 of every row (and, when the drafts can fill the block,
            #    reads the next block after the last state: a row's states stop changing once its block is filled,
            #    so the last is the filled one); acceptance of all drafts at once
            count = states.shape[1]
            verify, ahead = block.verify(states, True, count - 1 if count - 1 == left else None)
            accepted = self._accepted(block, verify.logits, states, drafts, committed)
            rows = torch.arange(ids.shape[0], device=ids.device)
            block.commit(states[rows, accepted], accepted)
            if ahead is not None:  # exact for the next block where the row ended its block filled
                block.carry(ahead, (states[rows, accepted] != block.mask_id).all(dim=-1))
            block.record_acceptance(accepted, masked.any(dim=1), self.draft_tokens)
            exact = type(exact)(logits=verify.logits[rows, accepted], lm_head_input=verify.lm_head_input[rows, accepted])

    def _draft(self, block: BlockContext, ids, masked, committed, hidden, count: int):
        """`count` head steps from `ids` (S_1): candidate states [n, count+1, L] and draft masks [n, count, L]."""
        positions = block.positions
        states, drafts = [ids], []
        acc, current, open_ = hidden, ids, masked
        for k in range(count):
            acc = acc + self.head(block.embed(current), acc, position_ids=positions)
            logits = block.lm_head(acc)
            block.head_forward_done(logits)
            tokens, confidence = block.propose(logits, open_, committed + k)
            draft = top_k_positions(confidence, open_, 1)
            current = torch.where(draft, tokens, current)
            open_ = open_ & ~draft
            states.append(current)
            drafts.append(draft)
        return torch.stack(states, dim=1), torch.stack(drafts, dim=1)

    @staticmethod
    def _accepted(block: BlockContext, logits, states, drafts, committed) -> torch.Tensor:
        """Accepted drafts per row [n]: the longest prefix of k with the backbone's pick on S_k equal to d_k."""
        count = drafts.shape[1]
        on = states[:, :count] == block.mask_id
        offsets = torch.arange(count, device=committed.device)
        v_tokens, v_confidence = block.propose(logits[:, :count], on, committed.unsqueeze(1) + offsets)
        v_pick = top_k_positions(v_confidence, on, 1)
        same_position = (v_pick == drafts).all(dim=-1) & drafts.any(dim=-1)
        same_token = (torch.where(v_pick, v_tokens, 0) == torch.where(drafts, states[:, 1:], 0)).all(dim=-1)
        return (same_position & same_token).long().cumprod(dim=1).sum(dim=1)
