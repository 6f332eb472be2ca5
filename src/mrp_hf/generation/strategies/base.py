"""What a reveal strategy is: given per-position confidences, decide which masked positions to commit."""

from __future__ import annotations

import torch


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
    k = torch.as_tensor(k, device=confidence.device).reshape(-1, 1) if not isinstance(k, int) else k
    return (confidence_ranks(confidence) < k) & masked


class BlockDecoder:
    """Fills one block of every active row, using the engine's counted `forward` and `propose`.

    The plain decoder below alternates one backbone forward and one reveal decision; MRP modes replace it.
    """

    def decode_block(self, engine, state, start: int, end: int) -> None:
        raise NotImplementedError

    @staticmethod
    def forward_steps(engine, state, start: int, end: int):
        """While a row still has masked positions in the block: one backbone forward (with the lm_head's input)
        per step. Yields (step, block ids [n, L], masked [n, L], BackboneOutput); the caller commits."""
        step = 0
        while True:
            block = state.canvas[state.active, start:end]
            masked = block == engine.mask_id
            if not masked.any():
                return
            yield step, block, masked, engine.forward(state, start, end, step, output_hidden_states=True)
            step += 1


def stalled_rows_error(state, stalled: torch.Tensor, confidence: torch.Tensor) -> RuntimeError:
    state.guard.check()  # non-finite logits are the usual cause: name the model part that produced them
    return RuntimeError(
        f"decoding stalled: no position revealed for rows {state.active[stalled].tolist()} "
        f"(confidences {confidence[stalled].tolist()}); the backbone's logits may contain NaN."
    )


class StepwiseDecoder(BlockDecoder):
    """The backbone's own decoding: per step, a. one forward, b. proposals, c. the strategy's reveals."""

    def __init__(self, strategy: RevealStrategy):
        self.strategy = strategy

    def decode_block(self, engine, state, start: int, end: int) -> None:
        step = 0
        while True:
            active = state.active
            masked = state.canvas[active, start:end] == engine.mask_id
            has_work = masked.any(dim=1)
            if not has_work.any():
                return
            # a. backbone forward
            logits = engine.forward(state, start, end, step, has_work=has_work).logits
            # b. proposals
            tokens, confidence = engine.propose(state, logits, start, end, masked, state.committed[active])
            # c. reveal and commit
            reveal = self.strategy.select(confidence, masked, step)
            if not self.strategy.may_reveal_nothing:
                stalled = has_work & ~reveal.any(dim=1)
                if stalled.any():
                    raise stalled_rows_error(state, stalled, confidence)
            if active.numel() == state.canvas.shape[0]:  # every row active: write in place, no index gathers
                window = state.canvas[:, start:end]
                window.copy_(torch.where(reveal, tokens, window))
                state.committed += reveal.sum(dim=1)
            else:
                state.canvas[active, start:end] = torch.where(reveal, tokens, state.canvas[active, start:end])
                state.committed[active] += reveal.sum(dim=1)
            step += 1
