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
    """Per row (tensors [batch]): `pads` canvas columns before the first prompt token; `answer_start` the first
    answer column; `answer_end` = answer_start + max_new_tokens (what is returned); `decode_end` the end of the
    row's last decoding block (>= answer_end). `length` is the canvas width; the decoding blocks are
    [first_block + j * block_length, ...) up to `length` (`blocks`); `grid` is the attention block (None:
    bidirectional)."""

    pads: torch.Tensor
    answer_start: torch.Tensor
    answer_end: torch.Tensor
    decode_end: torch.Tensor
    length: int
    first_block: int
    block_length: int
    grid: int | None
    alignment: str

    @property
    def blocks(self):
        """The decoding blocks [start, end) in canvas columns, in decoding order (a generator)."""
        return ((start, start + self.block_length) for start in range(self.first_block, self.length, self.block_length))

    def _shift(self) -> torch.Tensor:
        if self.alignment == "answer" and self.grid:
            return (self.pads // self.grid) * self.grid
        return self.pads

    def last_position(self) -> int:
        """The largest position id any row reaches (computed without building the position tensor)."""
        return int((self.decode_end - 1 - self._shift()).max())

    def positions(self, device: torch.device) -> torch.Tensor:
        """Position ids [batch, length]: each row counts from 0 at its first prompt token (pads clamp to 0).

        Under the "answer" alignment of a block-causal model the shift is a whole number of blocks, so that the
        model's grid stays on the canvas grid (the pads inside the first block keep positions)."""
        shift = self._shift()
        columns = torch.arange(self.length, device=device).unsqueeze(0)
        return (columns - shift.to(device).unsqueeze(1)).clamp_min(0)


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
    lengths = torch.tensor(prompt_lengths, dtype=torch.long)
    new = max_new_tokens
    if alignment == "sequence":
        if grid is None:
            raise ValueError(
                "block_alignment='sequence' counts blocks of a block-causal attention from each row's first token; "
                "this backbone is bidirectional (its blocks always start at the answer): use 'answer'."
            )
        prompt_blocks = lengths // grid
        pads = torch.zeros_like(lengths) if left_aligned else (prompt_blocks.max() - prompt_blocks) * grid
        answer_start = pads + lengths
        decode_end = pads + -(-(lengths + new) // grid) * grid
        first = int(answer_start.min()) // grid * grid
        length = int(decode_end.max())
    else:
        align = grid or 1
        width = -(-int(lengths.max()) // align) * align
        pads = width - lengths
        answer_start = torch.full_like(lengths, width)
        decode_end = answer_start + new
        length = width + new
        first = width
    return CanvasLayout(
        pads=pads, answer_start=answer_start, answer_end=answer_start + new, decode_end=decode_end, length=length,
        first_block=first, block_length=block_length, grid=grid, alignment=alignment,
    )
