"""`mrp_mode="speculative"`: lossless MRP decoding in the static regime (one exact token per step).

One round, from exact backbone logits on the current state S (the seed):
1. the backbone's own pick on S (most confident masked position, its token) is exact: commit it -> S_1;
2. drafting: the head, applied recurrently on the hidden-state accumulator, predicts the logits of
   S_1, S_2, ... and proposes the pick d_k on each S_k -> S_{k+1} = S_k + d_k (no backbone forward);
3. verification: ONE backbone forward over the candidate states S_1 .. S_{K+1}, stacked in the batch or
   packed in one sequence per row (`verify_layout`, see `DecodingEngine.forward`); d_k is accepted iff the backbone's pick on S_k is d_k (same position, same token); each row keeps its
   own longest accepted prefix, and the verify logits of the state it stops at seed the next round.
Picks are made by the same `TokenProposer` as static decoding, with the same committed count, so the
keyed random draws coincide and the output equals static decoding token for token, greedy or sampled.
"""

from __future__ import annotations

import torch

from ..guard import HEAD_PART
from .base import BlockDecoder, stalled_rows_error, top_k_positions


class SpeculativeDecoder(BlockDecoder):
    def __init__(self, head, draft_tokens: int):
        if draft_tokens < 1:
            raise ValueError(f"mrp_draft_tokens={draft_tokens} must be >= 1.")
        self.head = head
        self.draft_tokens = draft_tokens

    def _draft(self, engine, state, start, end, block, masked, committed, hidden):
        """Up to K head steps from `block` (S_1): returns the candidate states [S_1..S_k+1] and draft masks."""
        embed, lm_head = engine.adapter.get_input_embeddings(), engine.adapter.get_output_embeddings()
        positions = state.positions[state.active, start:end]
        states, drafts = [block], []
        acc, current, open_ = hidden, block, masked
        for k in range(self.draft_tokens):
            if not open_.any():
                break
            acc = acc + self.head(embed(current), acc, position_ids=positions)
            state.stats.head_forwards += 1
            logits = lm_head(acc)
            state.guard.watch(HEAD_PART, logits)
            tokens, confidence = engine.propose(state, logits, start, end, open_, committed + k)
            draft = top_k_positions(confidence, open_, 1)
            current = torch.where(draft, tokens, current)
            open_ = open_ & ~draft
            states.append(current)
            drafts.append(draft)
        return states, drafts

    @torch.no_grad()
    def decode_block(self, engine, state, start: int, end: int) -> None:
        mask_id = engine.mask_id
        layout = engine.verify_layout()
        seed = engine.forward(state, start, end, step=0, output_hidden_states=True)
        step = 1
        while True:
            active = state.active
            block = state.canvas[active, start:end]
            masked = block == mask_id
            has_work = masked.any(dim=1)
            if not has_work.any():
                return
            committed = state.committed[active]
            # 1. the exact pick on S
            tokens, confidence = engine.propose(state, seed.logits, start, end, masked, committed)
            pick = top_k_positions(confidence, masked, 1)
            stalled = has_work & ~pick.any(dim=1)
            if stalled.any():
                raise stalled_rows_error(state, stalled, confidence)
            block = torch.where(pick, tokens, block)
            committed = committed + pick.any(dim=1)
            state.canvas[active, start:end] = block
            state.committed[active] = committed
            masked = masked & ~pick
            if not masked.any():
                return
            # 2. drafts from the head
            states, drafts = self._draft(engine, state, start, end, block, masked, committed, seed.hidden_states)
            # 3. one backbone forward verifies S_1 .. S_k+1 of every row
            copies = len(states)
            n, length = block.shape
            candidates = state.canvas[active].repeat_interleave(copies, dim=0)
            candidates[:, start:end] = torch.stack(states, dim=1).reshape(n * copies, length)
            verify = engine.forward(state, start, end, step, output_hidden_states=True, canvas=candidates, copies=copies,
                                    layout=layout)
            step += 1
            logits = verify.logits.view(n, copies, length, -1)
            hidden = verify.hidden_states.view(n, copies, length, -1)
            accepted = torch.zeros(n, dtype=torch.long, device=block.device)
            still = torch.ones(n, dtype=torch.bool, device=block.device)
            for k, draft in enumerate(drafts):
                on = states[k] == mask_id
                v_tokens, v_conf = engine.propose(state, logits[:, k], start, end, on, committed + k)
                v_pick = top_k_positions(v_conf, on, 1)
                same = (v_pick == draft).all(dim=1) & draft.any(dim=1)
                same &= (torch.where(v_pick, v_tokens, 0) == torch.where(draft, states[k + 1], 0)).all(dim=1)
                still &= same
                accepted += still.long()
            rows = torch.arange(n, device=block.device)
            final = torch.stack(states, dim=1)[rows, accepted]
            state.canvas[active, start:end] = final
            state.committed[active] = committed + accepted
            state.stats.record_acceptance(accepted[masked.any(dim=1)].tolist())
            seed = type(seed)(logits=logits[rows, accepted], hidden_states=hidden[rows, accepted])
