"""Sending a batch's answer to a transformers streamer while it decodes, the way transformers' own diffusion
generation does (`DiffusionGemma`'s generate and `TextDiffusionStreamer` in transformers 5.x):

- `put(prompt ids [batch, prompt_len])` first;
- `put_draft(value=[batch, k])` after every step that commits tokens, when the streamer has `put_draft`: the
  answer tokens not yet confirmed up to the end of the current block, mask tokens where still undecided;
- `put([batch, k])` when every row has finished the answer tokens up to a point: those confirmed tokens (pad
  after a row's EOS or stopping point, as in the returned sequences), so the prompt and the `put` chunks,
  concatenated, are the returned sequences up to the end of the last block any row decoded (what follows is pad
  in every row and is not sent);
- `end()`.

Values have one row per prompt: transformers' `TextStreamer`/`TextDiffusionStreamer` accept batch size 1 and raise
their own error otherwise; a streamer of your own may take batches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class AnswerStream:
    """The streamer of one batch, fed in answer coordinates (token i of every row's answer is column i)."""

    def __init__(self, streamer: Any, max_new_tokens: int, answers: Callable[[Any, int], torch.Tensor]):
        self.streamer = streamer
        self.max_new_tokens = max_new_tokens
        self.answers = answers  # (state, length) -> the first `length` answer tokens of every row, as returned
        self.confirmed = 0  # answer tokens already sent through put
        self.takes_drafts = callable(getattr(streamer, "put_draft", None))

    def prompt(self, input_ids: torch.Tensor) -> None:
        self.streamer.put(input_ids.cpu())

    def draft(self, state: Any, end: int) -> None:
        """After a commit inside the block ending at canvas column `end`."""
        if not self.takes_drafts:
            return
        upto = self._offset(state, end, max)
        if upto > self.confirmed:
            self.streamer.put_draft(value=self.answers(state, upto)[:, self.confirmed :].cpu())

    def block_done(self, state: Any, end: int, decoding: list[int], still_decoding: list[int]) -> None:
        """After the block ending at column `end`: `decoding` are the rows that decoded it, `still_decoding` those
        that go on. Confirmed: the answer tokens every continuing row has; once none goes on, those of the row that
        got furthest (what follows is pad in every row, and is not sent: a row's stream ends at its EOS block)."""
        if still_decoding:
            upto = self._offset(state, end, min, still_decoding)
        else:
            upto = self._offset(state, end, max, decoding)
        if upto > self.confirmed:
            self.streamer.put(self.answers(state, upto)[:, self.confirmed :].cpu())
            self.confirmed = upto

    def finish(self) -> None:
        self.streamer.end()

    def _offset(self, state: Any, end: int, pick, rows: list[int] | None = None) -> int:
        """Answer tokens decoded up to column `end`: `pick` (min: by every row; max: by some row) over the rows
        still decoding; rows that are done count as fully decoded."""
        if rows is None:
            rows = state.active.tolist()
        if not rows:
            return self.max_new_tokens
        starts = state.layout.answer_start
        return max(0, min(self.max_new_tokens, pick(end - starts[row] for row in rows)))
