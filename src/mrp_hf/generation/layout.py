"""Where each row's prompt and answer sit on the canvas, and which blocks are decoded in which order.

Two alignments of a row's blocks (`block_alignment`):

- `"sequence"`: blocks are counted from the row's first token, as the block-causal families' own generate
  functions and training code do (SDAR, Fast-dLLM v2, LLaDA2): the prompt's tail shares its block with the first
  answer tokens, and the last block is decoded whole (its positions beyond the answer change what the model
  sees) and then cut to `max_new_tokens`. In a batch, each row is left-padded by a whole number of blocks so that
  every row's first decoding block is the same canvas block (the canvas grid is then every row's own grid);
  families that cannot mask padding get no pads at all (each row's prompt at column 0, as Fast-dLLM v2's
  `batch_sample` lays it out). Rows then start their answers at different columns.
- `"answer"`: the answer of every row starts at one column, on a block boundary (block-causal: the prompts are
  left-padded to a multiple of the block), and blocks run uniformly from there: the layout of the project's
  reference DLM (trained that way) and of the bidirectional families (LLaDA, Dream count blocks from the answer
  start).

The plan is computed once per batch, on the host, from the prompt lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ALIGNMENTS = ("sequence", "answer")


@dataclass(frozen=True)
class CanvasLayout:
    """Per row (host lists of ints, [batch]): `pads` canvas columns before the first prompt token; `answer_start`
    the first answer column; `answer_end` = answer_start + max_new_tokens (what is returned); `decode_end` the end
    of the row's last decoding block (>= answer_end). `length` is the canvas width; the decoding blocks are
    [first_block + j * block_length, ...) up to `length` (`blocks`); `grid` is the attention block (None:
    bidirectional). Kept on the host: reading the plan never waits for the device (`tensor` gives device copies)."""

    pads: list[int]
    answer_start: list[int]
    answer_end: list[int]
    decode_end: list[int]
    length: int
    first_block: int
    block_length: int
    grid: int | None
    alignment: str

    @property
    def blocks(self):
        """The decoding blocks [start, end) in canvas columns, in decoding order (a generator)."""
        return ((start, start + self.block_length) for start in range(self.first_block, self.length, self.block_length))

    def tensor(self, name: str, device: torch.device | str = "cpu") -> torch.Tensor:
        """One of the per-row lists as a LongTensor on `device`."""
        return torch.tensor(getattr(self, name), dtype=torch.long, device=device)

    def _shift(self) -> list[int]:
        if self.alignment == "answer" and self.grid:
            return [(pads // self.grid) * self.grid for pads in self.pads]
        return self.pads

    def last_position(self) -> int:
        """The largest position id any row reaches (computed without building the position tensor)."""
        return max(end - 1 - shift for end, shift in zip(self.decode_end, self._shift(), strict=True))

    def positions(self, device: torch.device) -> torch.Tensor:
        """Position ids [batch, length]: each row counts from 0 at its first prompt token (pads clamp to 0).

        Under the "answer" alignment of a block-causal model the shift is a whole number of blocks, so that the
        model's grid stays on the canvas grid (the pads inside the first block keep positions)."""
        shift = torch.tensor(self._shift(), dtype=torch.long, device=device)
        columns = torch.arange(self.length, device=device).unsqueeze(0)
        return (columns - shift.unsqueeze(1)).clamp_min(0)


def plan_layout(
    prompt_lengths: list[int], max_new_tokens: int, block_length: int, grid: int | None, alignment: str,
    left_aligned: bool = False,
) -> CanvasLayout:
    """The canvas plan for prompts of these real lengths.

    `block_length` is the decoding block (a divisor of `grid` for block-causal models); `left_aligned` puts every
    row's prompt at column 0 (families whose attention cannot mask padding, with the "sequence" alignment).
    """
    if alignment not in ALIGNMENTS:
        raise ValueError(f"block_alignment={alignment!r} must be one of {list(ALIGNMENTS)}.")
    lengths, new = [int(n) for n in prompt_lengths], max_new_tokens
    if alignment == "sequence":
        if grid is None:
            raise ValueError(
                "block_alignment='sequence' counts blocks of a block-causal attention from each row's first token; "
                "this backbone is bidirectional (its blocks always start at the answer): use 'answer'."
            )
        most = max(n // grid for n in lengths)
        pads = [0 if left_aligned else (most - n // grid) * grid for n in lengths]
        answer_start = [p + n for p, n in zip(pads, lengths, strict=True)]
        decode_end = [p + -(-(n + new) // grid) * grid for p, n in zip(pads, lengths, strict=True)]
        first = min(answer_start) // grid * grid
        length = max(decode_end)
    else:
        align = grid or 1
        width = -(-max(lengths) // align) * align
        pads = [width - n for n in lengths]
        answer_start = [width] * len(lengths)
        decode_end = [width + new] * len(lengths)
        length = width + new
        first = width
    return CanvasLayout(
        pads=pads, answer_start=answer_start, answer_end=[a + new for a in answer_start], decode_end=decode_end,
        length=length, first_block=first, block_length=block_length, grid=grid, alignment=alignment,
    )
