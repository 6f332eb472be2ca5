"""`BlockContext`: everything a block decoder may use to fill one block, and nothing else.

A block decoder (the backbone's own stepwise decoding, or an MRP mode) sees the block [start, end) of the rows
still decoding through this small interface: the block's current ids and what is masked in it, a counted
backbone `forward` (optionally over several candidate versions of the block, for verification), `propose` /
`confidence_of` (tokens and confidences with the keyed random draws), `commit`, the shared embedding and lm_head
for a head, and counters for the stats. The canvas, the KV cache, the layout and the model stay with the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..backbones.base import BackboneOutput
from .guard import HEAD_PART

if TYPE_CHECKING:
    from .engine import DecodingEngine
    from .state import DecodingState


class BlockContext:
    """The block [start, end) of the active rows (n of them, block length L)."""

    def __init__(self, engine: DecodingEngine, state: DecodingState, start: int, end: int,
                 next_block: tuple[int, int] | None = None):
        self._engine, self._state = engine, state
        self.start, self.end = start, end
        #: the next decoding block (start, end) when a verify's lookahead may compute its first outputs (None: the
        #: last block, or a family whose next block cannot start from them: `DecodingEngine.can_carry`)
        self.next_block = next_block
        self.mask_id: int = engine.mask_id
        adapter = engine.adapter
        #: the backbone's input embedding and lm_head (shared with an MRP head, frozen)
        self.embed = adapter.get_input_embeddings()
        self.lm_head = adapter.get_output_embeddings()

    # ------------------------------------------------------------------ reading
    @property
    def length(self) -> int:
        return self.end - self.start

    def ids(self) -> torch.Tensor:
        """The block's current ids [n, L] (a copy)."""
        state = self._state
        if state.every_row_active:
            return state.canvas[:, self.start : self.end].clone()
        return state.canvas[state.active, self.start : self.end]

    def masked(self) -> torch.Tensor:
        """Bool [n, L]: positions of the block still masked."""
        return self.ids() == self.mask_id

    @property
    def committed(self) -> torch.Tensor:
        """Tokens committed so far per row [n] (what the keyed random draws count)."""
        return self._state.committed[self._state.active]

    @property
    def positions(self) -> torch.Tensor:
        """The block's position ids [n, L]."""
        return self._state.positions[self._state.active, self.start : self.end]

    # ------------------------------------------------------------------ the backbone
    def forward(self, hidden: bool = False, candidates: torch.Tensor | None = None,
                has_work: torch.Tensor | None = None, layout: str | None = None) -> BackboneOutput:
        """One counted backbone forward for the block. `candidates` ([n, c, L]) are c versions of the block per row
        evaluated in this one forward, "stacked" or "packed" (`layout`; default: the resolved `verify_layout`);
        outputs come back [n, c, L, ...]."""
        if candidates is None:
            return self._engine.forward(self._state, self.start, self.end, return_lm_head_input=hidden, has_work=has_work)
        return self._candidates_forward(candidates, hidden, has_work, layout, None)[0]

    def first_forward(self, hidden: bool = False) -> BackboneOutput:
        """The backbone's exact outputs on the block as the previous block left it: those the previous block's last
        verify computed in its lookahead when they are exact for every row (`carry`), else one forward."""
        carried, self._state.carried = self._state.carried, None
        if carried is not None and carried[0] == self.start and (carried[1].lm_head_input is not None or not hidden):
            if bool(carried[2].all()):  # one read of the device per block
                return carried[1]
        return self.forward(hidden=hidden)

    def verify(self, candidates: torch.Tensor, hidden: bool = False,
               lookahead_node: int | None = None) -> tuple[BackboneOutput, BackboneOutput | None]:
        """One forward over candidate states [n, c, L] (as `forward`). With `lookahead_node` (a candidate index, the
        same for every row) and a next block, that candidate also runs over the next block, still masked, in the
        same forward: its outputs there come back second ([n, next length, ...]), and are the next block's first
        outputs if the block ends as that candidate (`carry`). Whatever an earlier round carried is dropped."""
        self._state.carried = None
        if lookahead_node is None or self.next_block is None:
            return self.forward(hidden=hidden, candidates=candidates), None
        copies = candidates.shape[1]
        if lookahead_node == copies - 1:  # already last (a chain): nothing to move
            return self._candidates_forward(candidates, hidden, None, None, self.next_block)
        # that candidate runs last (the others keep their order), so that only the last copy reads further
        order = [i for i in range(copies) if i != lookahead_node] + [lookahead_node]
        back = torch.tensor([order.index(i) for i in range(copies)], device=candidates.device)
        out, ahead = self._candidates_forward(candidates[:, order], hidden, None, None, self.next_block)

        def restore(x):
            return None if x is None else x.index_select(1, back)

        return BackboneOutput(logits=restore(out.logits), lm_head_input=restore(out.lm_head_input)), ahead

    def carry(self, ahead: BackboneOutput, exact: torch.Tensor) -> None:
        """Keep a verify's lookahead outputs for the next block's `first_forward`; `exact` [n]: rows whose block
        ended as the lookahead candidate (the next block uses them only if every row's did)."""
        self._state.carried = (self.next_block[0], ahead, exact)

    def _candidates_forward(self, candidates, hidden, has_work, layout, lookahead):
        engine, state = self._engine, self._state
        n, copies, length = candidates.shape
        canvas = state.canvas[state.active].repeat_interleave(copies, dim=0)
        canvas[:, self.start : self.end] = candidates.reshape(n * copies, length)
        out = engine.forward(state, self.start, self.end, return_lm_head_input=hidden, canvas=canvas, copies=copies,
                             has_work=has_work, layout=layout or engine.verify_layout(), lookahead=lookahead)
        out, ahead = out if lookahead is not None else (out, None)
        lm_head_input = out.lm_head_input.view(n, copies, length, -1) if out.lm_head_input is not None else None
        return BackboneOutput(logits=out.logits.view(n, copies, length, -1), lm_head_input=lm_head_input), ahead

    def propose(self, logits: torch.Tensor, open_positions: torch.Tensor,
                committed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens and confidences for the block ([n, L], or [n, c, L] for logits [n, c, L, V] of c candidate
        states); confidence is -inf where `open_positions` is False. `committed`: the count the draws key on
        ([n] or [n, c]; default: the rows' current count)."""
        return self._engine.propose(self._state, logits, self.start, self.end, open_positions,
                                    self.committed if committed is None else committed)

    def confidence_of(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The confidence `propose` gives `tokens` under other logits (e.g. head-corrected)."""
        return self._engine.confidence_of(self._state, logits, tokens, self.start, self.end)

    # ------------------------------------------------------------------ writing
    def commit(self, ids: torch.Tensor, revealed: torch.Tensor) -> None:
        """The block's new ids [n, L] for the active rows, and how many tokens each row revealed [n]."""
        state = self._state
        if state.every_row_active:  # write in place, no index gathers
            state.canvas[:, self.start : self.end] = ids
            state.committed += revealed
        else:
            state.canvas[state.active, self.start : self.end] = ids
            state.committed[state.active] += revealed
        if state.stream is not None:  # a draft of the answer so far, for streamers that show them
            state.stream.draft(state, self.end)

    def raise_if_stalled(self, stalled: torch.Tensor, confidence: torch.Tensor) -> None:
        """Rows with masked positions that revealed nothing would loop for ever (NaN logits are the usual cause)."""
        if bool(stalled.any()):
            self._state.guard.check()  # name the model part that produced non-finite logits, if one did
            raise RuntimeError(
                f"decoding stalled: no position revealed for rows {self._state.active[stalled].tolist()} "
                f"(confidences {confidence[stalled].tolist()}); the backbone's logits may contain NaN."
            )

    # ------------------------------------------------------------------ counting
    def head_forward_done(self, logits: torch.Tensor | None = None) -> None:
        """Count one MRP head forward; `logits` (the head-corrected ones) are checked for NaN/+inf."""
        self._state.counters.head_forwards += 1
        if logits is not None:
            self._state.guard.watch(HEAD_PART, logits)

    def record_acceptance(self, accepted: torch.Tensor, counted: torch.Tensor, max_drafts: int) -> None:
        self._state.counters.record_acceptance(accepted, counted, max_drafts)

    def record_remask(self, proposed: torch.Tensor, revoked: torch.Tensor) -> None:
        """remask: proposals made and revoked in one step (bool [n, L] each)."""
        counters = self._state.counters
        counters.proposals += proposed.sum()
        counters.revoked_reveals += revoked.sum()
