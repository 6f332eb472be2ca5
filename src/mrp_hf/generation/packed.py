"""The packed verify forward: several candidate versions of a block in one sequence per row.

The speculative verifier evaluates K+1 candidate states of the current block in one backbone forward. Stacked,
they are K+1 rows (the prefix cache repeated per copy). Packed, each row is fed once as
[shared | copy 0 | copy 1 | ...]: `shared` is the uncached input that no copy can influence, copy j the j-th
candidate's positions from `shared_end` to the visible end, all copies with the same position ids. A query of
copy j sees the cache, `shared` and copy j only, under the family's usual rule (padding, and the block-causal
grid) applied to canvas positions, so each copy computes exactly what its own row computes stacked:

- block-causal: what lies before the model block holding the block's first scored position cannot see the block,
  so it is shared (it is also what the cache keeps); the copies hold the rest up to the visible end;
- bidirectional: every position attends to the block, so nothing uncached is shared and each copy holds
  everything from the cache end.

The last copy may run further than the others (`last_end`): the lookahead of the verify, which also reads the
next decoding block (still masked) after one candidate, so that the next block's first outputs come with it
(`BlockContext.forward_with_lookahead`).

The pattern's structure (which key each query may see, apart from padding) depends only on the shapes, so it is
built once per shape and cached (`PackedPatterns`); each call combines it with the rows' padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._compat import cache_length, crop_cache
from ..backbones.base import BackboneAdapter, BackboneOutput


@dataclass(frozen=True)
class PackedPattern:
    """For one shape: canvas position of every key ([shared_end + copies * length]) and the bool [q, k] structure
    (same copy or shared, and the block-causal grid) of the queries (the keys from the cache end on)."""

    key_positions: torch.Tensor
    structure: torch.Tensor


class PackedPatterns:
    """Patterns cached per (copies, cache end, shared end, visible end, last copy's end, grid, device); thread-safe
    to read (a dict filled with immutable values; two threads may build the same entry once each)."""

    def __init__(self, max_entries: int = 64):
        self._patterns: dict[tuple, PackedPattern] = {}
        self._max_entries = max_entries

    def get(self, copies: int, in_start: int, shared_end: int, visible_end: int, grid: int | None,
            device: torch.device, last_end: int | None = None) -> PackedPattern:
        last_end = visible_end if last_end is None else last_end
        key = (copies, in_start, shared_end, visible_end, last_end, grid, str(device))
        pattern = self._patterns.get(key)
        if pattern is None:
            pattern = _build_pattern(copies, in_start, shared_end, visible_end, last_end, grid, device)
            if len(self._patterns) >= self._max_entries:
                self._patterns.clear()  # shapes repeat per block; a long-lived engine must not grow without end
            self._patterns[key] = pattern
        return pattern


def _build_pattern(copies, in_start, shared_end, visible_end, last_end, grid, device) -> PackedPattern:
    length, last = visible_end - shared_end, last_end - shared_end  # one copy's segment, the last copy's
    key_pos = torch.cat([torch.arange(shared_end, device=device),
                         torch.arange(shared_end, visible_end, device=device).repeat(copies - 1),
                         torch.arange(shared_end, last_end, device=device)])
    key_copy = torch.cat([torch.full((shared_end,), -1, device=device),
                          torch.arange(copies - 1, device=device).repeat_interleave(length),
                          torch.full((last,), copies - 1, device=device)])
    query_pos, query_copy = key_pos[in_start:], key_copy[in_start:]
    structure = (key_copy[None, :] < 0) | (key_copy[None, :] == query_copy[:, None])
    if grid:
        structure &= key_pos[None, :] // grid <= query_pos[:, None] // grid
    return PackedPattern(key_positions=key_pos, structure=structure)


def packed_forward(
    adapter: BackboneAdapter, patterns: PackedPatterns, canvas: torch.Tensor, canvas_mask: torch.Tensor,
    positions: torch.Tensor, cache, copies: int, span: tuple[int, int, int], keep: int, first_scored: int,
    grid: int | None, return_lm_head_input: bool, lookahead: tuple[int, int, int] | None = None,
) -> tuple[BackboneOutput, BackboneOutput | None]:
    """One forward over `canvas` ([n * copies, T], copies row-major) packed as above; `span` = (block start, block
    end, visible end). Returns the block's aligned outputs [n * copies, L, ...] and crops the cache to `keep`
    (never past copy 0's unchanged part), so it ends exactly as after a stacked verify. `lookahead` = (next block
    start, next block end, its visible end): the last copy runs to that visible end, and its outputs on the next
    block come back second ([n, next length, ...]; None without a lookahead)."""
    start, end, visible_end = span
    last_end = lookahead[2] if lookahead else visible_end
    n, width = canvas.shape[0] // copies, canvas.shape[1]
    in_start = cache_length(cache)
    scoring = adapter.first_scoring_position(first_scored)  # the input position whose output scores it
    shared_end = max(in_start, (scoring // grid) * grid) if grid else in_start
    if shared_end > scoring:
        raise RuntimeError(f"cannot pack the verify forward: cache {in_start}, block [{start}, {end}), keep {keep}")
    length = visible_end - shared_end
    rows = canvas.view(n, copies, width)
    input_ids = torch.cat([rows[:, 0, in_start:shared_end], rows[:, :-1, shared_end:visible_end].reshape(n, -1),
                           rows[:, -1, shared_end:last_end]], dim=1)
    position_ids = torch.cat([positions[:, in_start:shared_end], positions[:, shared_end:visible_end].repeat(1, copies - 1),
                              positions[:, shared_end:last_end]], dim=1)
    pattern = patterns.get(copies, in_start, shared_end, visible_end, grid, canvas.device, last_end)
    allowed = canvas_mask[:, pattern.key_positions].bool()[:, None, None, :] & pattern.structure[None, None]
    out = adapter.forward(input_ids, position_ids=position_ids, past_key_values=cache,
                          return_lm_head_input=return_lm_head_input, grid=grid, pattern=allowed)
    if cache is not None:
        crop_cache(cache, keep)
    shared, block = shared_end - in_start, slice(start - shared_end, end - shared_end)
    last_copy = shared + (copies - 1) * length  # where the last copy's segment starts in the input

    def per_copy(x):
        if x is None:
            return None
        first = x[:, shared:last_copy].reshape(n, copies - 1, length, -1)[:, :, block]
        return torch.cat([first, x[:, last_copy:][:, None, block]], dim=1).reshape(n * copies, end - start, -1)

    def next_block(x):
        return None if x is None else x[:, last_copy + lookahead[0] - shared_end : last_copy + lookahead[1] - shared_end]

    outputs = BackboneOutput(logits=per_copy(out.logits), lm_head_input=per_copy(out.lm_head_input))
    if lookahead is None:
        return outputs, None
    return outputs, BackboneOutput(logits=next_block(out.logits), lm_head_input=next_block(out.lm_head_input))
