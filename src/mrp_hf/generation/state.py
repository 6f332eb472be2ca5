"""What one `generate` call carries from step to step: the batch's decoding state and its counted stats."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.utils import ModelOutput

from .guard import NonFiniteGuard
from .layout import CanvasLayout


@dataclass
class GenerationStats:
    """Counted, not estimated. A batched backbone forward counts once in `backbone_forwards`; each row
    also counts the forwards it took part in while it still had masked positions in its block."""

    backbone_forwards: int = 0
    head_forwards: int = 0
    row_backbone_forwards: list[int] = field(default_factory=list)
    row_new_tokens: list[int] = field(default_factory=list)
    #: remask mode: tokens proposed by the threshold rule, and proposals the head revoked
    proposals: int = 0
    revoked_reveals: int = 0
    #: speculative mode: acceptance_histogram[j] = verify rounds (per row) that accepted j drafts
    acceptance_histogram: list[int] = field(default_factory=list)

    def record_acceptance(self, accepted: list[int]) -> None:
        for j in accepted:
            if j >= len(self.acceptance_histogram):
                self.acceptance_histogram += [0] * (j + 1 - len(self.acceptance_histogram))
            self.acceptance_histogram[j] += 1

    def merge(self, part: GenerationStats, rows: list[int]) -> None:
        """Add the stats of a sub-batch whose row i is row rows[i] of this batch (its forwards ran separately)."""
        self.backbone_forwards += part.backbone_forwards
        self.head_forwards += part.head_forwards
        self.proposals += part.proposals
        self.revoked_reveals += part.revoked_reveals
        for j, count in enumerate(part.acceptance_histogram):
            self.record_acceptance([j] * count)
        for i, row in enumerate(rows):
            self.row_backbone_forwards[row] = part.row_backbone_forwards[i]
            self.row_new_tokens[row] = part.row_new_tokens[i]

    @property
    def accepted_drafts(self) -> int:
        return sum(j * count for j, count in enumerate(self.acceptance_histogram))

    @property
    def tokens_per_forward(self) -> list[float]:
        """Per row: tokens committed (up to and including its EOS block) / backbone forwards it needed."""
        return [t / f if f else 0.0 for t, f in zip(self.row_new_tokens, self.row_backbone_forwards, strict=True)]

    @property
    def mean_tokens_per_forward(self) -> float:
        tpf = self.tokens_per_forward
        return sum(tpf) / len(tpf) if tpf else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "backbone_forwards": self.backbone_forwards,
            "head_forwards": self.head_forwards,
            "row_backbone_forwards": list(self.row_backbone_forwards),
            "row_new_tokens": list(self.row_new_tokens),
            "acceptance_histogram": list(self.acceptance_histogram),
            "proposals": self.proposals,
            "revoked_reveals": self.revoked_reveals,
            "accepted_drafts": self.accepted_drafts,
            "tokens_per_forward": self.tokens_per_forward,
            "mean_tokens_per_forward": self.mean_tokens_per_forward,
        }


class StatCounters:
    """The stats while decoding, kept on the device so that counting never waits for it (one read at the end).

    Per row: backbone forwards it took part in with work to do, and answer tokens committed so far; per batch:
    backbone and head forwards (host ints: the host issues them), remask proposals and revocations, and the
    speculative acceptance histogram (a device tensor indexed by accepted drafts)."""

    def __init__(self, batch: int, device: torch.device):
        self.backbone_forwards = 0
        self.head_forwards = 0
        self.row_backbone_forwards = torch.zeros(batch, dtype=torch.long, device=device)
        self.row_new_tokens = torch.zeros(batch, dtype=torch.long, device=device)
        self.proposals = torch.zeros((), dtype=torch.long, device=device)
        self.revoked_reveals = torch.zeros((), dtype=torch.long, device=device)
        self.acceptance = torch.zeros(0, dtype=torch.long, device=device)

    def record_acceptance(self, accepted: torch.Tensor, counted: torch.Tensor, max_drafts: int) -> None:
        """Add one verify round: `accepted` drafts (<= `max_drafts`) per row, for the rows where `counted`."""
        bins = max_drafts + 1
        if self.acceptance.numel() < bins:  # sizes known on the host: growing needs no read of the device
            grown = torch.zeros(bins, dtype=torch.long, device=accepted.device)
            grown[: self.acceptance.numel()] = self.acceptance
            self.acceptance = grown
        self.acceptance.scatter_add_(0, accepted, counted.long())

    def finish(self) -> GenerationStats:
        """The public stats, from one read of the device counters."""
        batch = self.row_backbone_forwards.numel()
        values = torch.cat([self.row_backbone_forwards, self.row_new_tokens, self.proposals.view(1),
                            self.revoked_reveals.view(1), self.acceptance]).tolist()
        return GenerationStats(
            backbone_forwards=self.backbone_forwards,
            head_forwards=self.head_forwards,
            row_backbone_forwards=values[:batch],
            row_new_tokens=values[batch : 2 * batch],
            proposals=values[2 * batch],
            revoked_reveals=values[2 * batch + 1],
            acceptance_histogram=_trimmed(values[2 * batch + 2 :]),
        )


def _trimmed(histogram: list[int]) -> list[int]:
    while histogram and histogram[-1] == 0:
        histogram = histogram[:-1]
    return histogram


@dataclass
class DecodingState:
    """Everything that changes while one batch decodes; rows of `canvas` are all rows, `active` indexes those
    still decoding (and, in that order, the rows of the KV cache); `layout` says where each row's prompt and
    answer sit (`generation/layout.py`). Block decoders never see it: they get a `BlockContext`."""

    canvas: torch.Tensor
    canvas_mask: torch.Tensor
    positions: torch.Tensor
    keys: torch.Tensor
    committed: torch.Tensor
    active: torch.Tensor
    cache: Any
    counters: StatCounters
    layout: CanvasLayout
    answer_start: torch.Tensor  # the layout's per-row columns, on the device [batch]
    answer_end: torch.Tensor
    decode_end: torch.Tensor
    guard: NonFiniteGuard = field(default_factory=NonFiniteGuard)
    block_forwards: int = 0  # backbone forwards spent on the current block so far
    #: per row, the canvas column from which its answer is pad because a stopping criterion fired [batch]
    stop_column: torch.Tensor | None = None
    #: where the answer goes as it is decoded (`generation/streaming.py`), when generate() got a streamer
    stream: Any = None
    #: the next block's first outputs from a verify forward's lookahead: (that block's start, BackboneOutput
    #: [n, L, ...], whether each row's is exact [n]); its first forward uses them instead (`BlockContext`)
    carried: Any = None

    @property
    def every_row_active(self) -> bool:
        """The common case, where row gathers and scatters can be skipped (no host read: a shape)."""
        return self.active.numel() == self.canvas.shape[0]


@dataclass
class MRPGenerateOutput(ModelOutput):
    """`sequences`: prompt + generated tokens, [batch, prompt_len + max_new_tokens]; `stats`: `GenerationStats`."""

    sequences: torch.LongTensor | None = None
    stats: GenerationStats | None = None
