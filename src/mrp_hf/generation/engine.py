"""The block loop shared by every decoding strategy: canvas, prefix cache, EOS stop, batches, stats."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.utils import ModelOutput, logging

from .._compat import cache_length, crop_cache, select_cache_rows
from ..backbones.base import BackboneAdapter, BackboneOutput
from .config import MRPGenerationConfig
from .guard import BACKBONE_PART, NonFiniteGuard
from .layout import CanvasLayout, plan_layout
from .sampling import TokenProposer, row_keys
from .strategies import BlockDecoder, DynamicStrategy, RevealStrategy, StaticStrategy, StepwiseDecoder

logger = logging.get_logger(__name__)


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


@dataclass
class DecodingState:
    """Everything a block decoder reads and writes for one batch; rows of `canvas` are all rows, `active`
    indexes those still decoding (and, in that order, the rows of the KV cache); `layout` says where each
    row's prompt and answer sit (`generation/layout.py`)."""

    canvas: torch.Tensor
    canvas_mask: torch.Tensor
    positions: torch.Tensor
    keys: torch.Tensor
    committed: torch.Tensor
    active: torch.Tensor
    cache: Any
    stats: GenerationStats
    layout: CanvasLayout
    guard: NonFiniteGuard = field(default_factory=NonFiniteGuard)
    block_forwards: int = 0  # backbone forwards spent on the current block so far


@dataclass
class MRPGenerateOutput(ModelOutput):
    """`sequences`: prompt + generated tokens, [batch, prompt_len + max_new_tokens]; `stats`: `GenerationStats`."""

    sequences: torch.LongTensor | None = None
    stats: GenerationStats | None = None


def validate_prompt(input_ids: Any, attention_mask: Any, vocab_size: int | None = None,
                    mask_token_id: int | None = None) -> torch.Tensor:
    """Check types, shapes, left padding and token ids; return the attention mask (all ones when none was given).

    Every id must index the embedding (`vocab_size`): pads too, since they are fed to the model. A prompt may
    not contain the mask token: masked-diffusion decoding here fills the answer region only (no infilling),
    and a mask in the prompt would be taken for an answer position that never gets decoded.
    """
    for name, value in (("input_ids", input_ids), ("attention_mask", attention_mask)):
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(
                f"{name} must be a 2-D torch.Tensor [batch, prompt_len], got {type(value).__name__}; "
                f"tokenize with return_tensors='pt'."
            )
    if input_ids.dim() != 2:
        raise TypeError(f"input_ids must be a 2-D LongTensor [batch, prompt_len], got Tensor{tuple(input_ids.shape)}.")
    if input_ids.dtype not in (torch.long, torch.int, torch.int32):
        raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}.")
    if input_ids.shape[0] == 0:
        raise ValueError("input_ids is an empty batch (shape [0, n]): pass at least one prompt.")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids has no prompt tokens; diffusion decoding needs a prompt of at least one token.")
    if vocab_size is not None:
        bad = (input_ids < 0) | (input_ids >= vocab_size)
        if bad.any():
            row, col = (int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"input_ids[{row}, {col}] = {int(input_ids[row, col])} is not a token id of this model (ids run from "
                f"0 to {vocab_size - 1}); tokenize with the backbone's own tokenizer."
            )
    if attention_mask is None:
        mask = torch.ones_like(input_ids, dtype=torch.long)
    else:
        mask = _check_attention_mask(input_ids, attention_mask)
    if mask_token_id is not None:
        masked = (input_ids == mask_token_id) & mask.bool()
        if masked.any():
            row, col = (int(i) for i in masked.nonzero()[0])
            raise ValueError(
                f"input_ids[{row}, {col}] is the mask token ({mask_token_id}): prompts may not contain masks here "
                f"(the answer region after the prompt is what gets decoded; infilling inside the prompt is not "
                f"supported). Remove the mask tokens from the prompt."
            )
    return mask


def _check_attention_mask(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids has {tuple(input_ids.shape)}; "
            f"pass the mask the tokenizer returned with these ids."
        )
    mask = attention_mask.to(torch.long)
    if ((mask != 0) & (mask != 1)).any():
        raise ValueError("attention_mask must contain only 0 and 1.")
    if (mask.sum(dim=1) == 0).any():
        raise ValueError("a row of attention_mask is all zeros: every prompt needs at least one real token.")
    if (mask[:, 1:] < mask[:, :-1]).any():
        raise ValueError(
            "attention_mask is not left-padded (a 1 is followed by a 0). Diffusion decoding appends the answer "
            "after the prompt: tokenize with tokenizer.padding_side = 'left'."
        )
    return mask


class DecodingEngine:
    """Runs block-wise masked-diffusion decoding of one batch with one reveal strategy.

    The steps below are the numbered steps of `MRPModel.generate`'s docstring:

    1. Lay out the canvas (`plan_layout`): each row's prompt, then its answer region of mask tokens, with the
       family's block alignment (block-causal families count blocks from each row's first token, as their own
       generate functions do; the reference DLM and bidirectional families start blocks at the answer);
       position ids per row. Rows that must not share a padded batch are decoded in groups of equal length.
    2. For each decoding block, while a row still has masked positions in it:
       a. one backbone forward over the visible part of the canvas (block-causal: up to the end of the model
          block holding it; with the prefix cache when on); families that commit a block's first token
          autoregressively (Fast-dLLM v2) get that forward and token first;
       b. propose a token and a confidence per position (`TokenProposer`);
       c. the strategy picks the positions to reveal; commit them; count stats.
    3. After each block: rows whose answer holds EOS, or whose last block is done, stop (the rest of their
       answer becomes pad) and leave the batch and the cache; the block goes to the streamer.
    4. Return the sequences (prompt + `max_new_tokens` answer tokens per row) and the stats.
    """

    def __init__(
        self,
        adapter: BackboneAdapter,
        config: MRPGenerationConfig,
        strategy: RevealStrategy | None = None,
        block_decoder: BlockDecoder | None = None,
    ):
        self.adapter = adapter
        self.config = config
        self.mask_id = adapter.mask_token_id
        self.alignment = self._resolve_alignment()
        self.block_length = self._resolve_block_length()
        self.num_blocks = -(-config.max_new_tokens // self.block_length)
        self.strategy = strategy or self._default_strategy()
        self.block_decoder = block_decoder or StepwiseDecoder(self.strategy)
        self.proposer = TokenProposer(config, self.mask_id)
        self.use_cache = self._resolve_cache()
        self.refresh_commits_block_start = (
            self.use_cache and not adapter.exact_prefix_cache and adapter.commits_block_start_on_cache_refresh
        )
        self.input_vocab_size = adapter.get_input_embeddings().weight.shape[0]
        eos = config.eos_token_id
        self.eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        outside = [i for i in self.eos_ids if not 0 <= i < self.input_vocab_size]
        if outside:  # e.g. a config written for a larger vocabulary: harmless, but rows will not stop at it
            logger.warning_once(
                f"eos_token_id {outside} is outside this model's vocabulary (ids 0 to {self.input_vocab_size - 1}) and "
                f"can never be generated: rows will not stop early at it. Pass the tokenizer's eos_token_id."
            )
        pad = config.pad_token_id
        if pad is not None and not 0 <= pad < self.input_vocab_size:
            raise ValueError(
                f"pad_token_id={pad} is not a token id of this model (ids run from 0 to {self.input_vocab_size - 1}); "
                f"pass the tokenizer's pad_token_id."
            )
        in_vocab_eos = [i for i in self.eos_ids if 0 <= i < self.input_vocab_size]
        self.pad_id = pad if pad is not None else (in_vocab_eos[0] if in_vocab_eos else self.mask_id)

    # ------------------------------------------------------------------ set-up
    def _resolve_alignment(self) -> str:
        wanted = self.config.block_alignment
        if wanted is None:
            return self.adapter.block_alignment if self.adapter.block_causal else "answer"
        if wanted == "sequence" and not self.adapter.block_causal:
            raise ValueError(
                f"block_alignment='sequence' counts a block-causal model's blocks from each row's first token; "
                f"{self.adapter.family!r} ({type(self.adapter.model).__name__}) is bidirectional, its decoding blocks "
                f"always start at the answer: use block_alignment='answer' (or leave it unset)."
            )
        return wanted

    def _resolve_block_length(self) -> int:
        cfg, adapter = self.config, self.adapter
        model_block = adapter.block_size
        if cfg.block_length:
            block_length = cfg.block_length
        elif model_block:
            block_length = model_block
        elif adapter.default_block_length is not None:
            block_length = min(adapter.default_block_length, cfg.max_new_tokens)
        else:  # the family decodes the whole answer as one block (Dream's diffusion_generate)
            block_length = cfg.max_new_tokens
        if self.alignment == "answer" and cfg.max_new_tokens % block_length:
            raise ValueError(
                f"block_length={block_length} does not divide max_new_tokens={cfg.max_new_tokens}; use a "
                f"max_new_tokens that is a multiple of it (e.g. {-(-cfg.max_new_tokens // block_length) * block_length}), "
                f"or another block_length."
            )
        if model_block is not None and (block_length > model_block or model_block % block_length):
            raise ValueError(
                f"block_length={block_length} does not fit {adapter.family}'s attention block of {model_block} "
                f"tokens: a block-causal model can only decode blocks that tile its own (use {model_block} "
                f"or a divisor of it)."
            )
        return block_length

    def _default_strategy(self) -> RevealStrategy:
        cfg = self.config
        if cfg.threshold is not None:
            return DynamicStrategy(cfg.threshold, inclusive=self.adapter.threshold_inclusive)
        if cfg.steps is not None:
            if cfg.steps % self.num_blocks:
                raise ValueError(
                    f"steps={cfg.steps} is not a multiple of the number of blocks ({self.num_blocks} = "
                    f"max_new_tokens {cfg.max_new_tokens} / block_length {self.block_length}); use a multiple of "
                    f"{self.num_blocks} (e.g. steps={max(1, cfg.steps // self.num_blocks) * self.num_blocks})."
                )
            steps_per_block = cfg.steps // self.num_blocks
            if steps_per_block > self.block_length:
                raise ValueError(
                    f"steps={cfg.steps} gives {steps_per_block} steps per block of {self.block_length} tokens; "
                    f"use at most max_new_tokens={cfg.max_new_tokens} steps."
                )
            return StaticStrategy(steps_per_block=steps_per_block, schedule=cfg.step_schedule)
        if cfg.step_schedule != "even":
            raise ValueError(f"step_schedule={cfg.step_schedule!r} spreads a block over a number of steps: pass steps.")
        return StaticStrategy(tokens_per_step=cfg.tokens_per_step)

    def _resolve_cache(self) -> bool:
        wanted = self.config.prefix_cache
        if wanted is False:
            return False
        if not self.adapter.accepts_cache:
            if wanted:
                raise ValueError(self.adapter.cache_refusal())
            return False
        if self.adapter.exact_prefix_cache:
            return True
        if wanted:
            logger.info("Approximate prefix cache on a bidirectional model: output may differ from prefix_cache=False.")
        return bool(wanted)

    # ------------------------------------------------------------------ run
    @property
    def grid(self) -> int | None:
        """Block size of the model's block-causal attention (None: bidirectional)."""
        if not self.adapter.block_causal:
            return None
        return self.adapter.block_size or self.block_length

    def _groups(self, lengths: list[int]) -> list[list[int]]:
        """Rows decoded together: all of them, or (families whose attention ignores padding, under the answer
        alignment) groups of equal prompt length, which need no padding at all."""
        group = self.config.group_by_prompt_length
        if group is None:
            group = not self.adapter.supports_padding and self.alignment == "answer"
        if not group or len(set(lengths)) == 1:
            if not self.adapter.supports_padding and self.alignment == "answer" and len(set(lengths)) > 1:
                logger.warning_once(
                    f"{self.adapter.family}'s attention ignores attention_mask: with group_by_prompt_length=False the "
                    f"padded rows of a batch attend to their pads, so their answers may differ from unbatched decoding."
                )
            return [list(range(len(lengths)))]
        by_length: dict[int, list[int]] = {}
        for row, length in enumerate(lengths):
            by_length.setdefault(length, []).append(row)
        return [by_length[length] for length in sorted(by_length)]

    def _plan(self, lengths: list[int]) -> CanvasLayout:
        left_aligned = self.alignment == "sequence" and not self.adapter.supports_padding
        return plan_layout(lengths, self.config.max_new_tokens, self.block_length, self.grid, self.alignment,
                           left_aligned=left_aligned)

    @torch.no_grad()
    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, streamer=None) -> MRPGenerateOutput:
        prompt_mask = validate_prompt(input_ids, attention_mask, self.input_vocab_size, self.mask_id)
        if streamer is not None and input_ids.shape[0] != 1:
            raise ValueError(f"streamer works with batch size 1 only, got a batch of {input_ids.shape[0]}.")
        lengths = prompt_mask.sum(dim=1).tolist()
        groups = self._groups(lengths)
        layouts = [self._plan([lengths[row] for row in rows]) for rows in groups]
        for layout in layouts:  # before anything is allocated
            self._check_positions(layout, input_ids.shape[1])
        device = self.adapter.get_input_embeddings().weight.device
        input_ids, prompt_mask = input_ids.to(device), prompt_mask.to(device)
        if len(groups) == 1:
            return self._run_batch(input_ids, prompt_mask, layouts[0], streamer)
        batch, prompt_len = input_ids.shape
        sequences = torch.full((batch, prompt_len + self.config.max_new_tokens), self.pad_id, dtype=torch.long,
                               device=device)
        stats = GenerationStats(row_backbone_forwards=[0] * batch, row_new_tokens=[0] * batch)
        for rows, layout in zip(groups, layouts, strict=True):
            index = torch.tensor(rows, device=device)
            part = self._run_batch(input_ids[index], prompt_mask[index], layout, None)
            sequences[index] = part.sequences
            stats.merge(part.stats, rows)
        return MRPGenerateOutput(sequences=sequences, stats=stats)

    def _run_batch(self, input_ids: torch.Tensor, prompt_mask: torch.Tensor, layout: CanvasLayout,
                   streamer) -> MRPGenerateOutput:
        device = input_ids.device
        batch, prompt_len = input_ids.shape

        # 1. canvas, attention mask and positions
        canvas, canvas_mask = self._lay_out(input_ids, prompt_mask, layout)
        stats = GenerationStats(row_backbone_forwards=[0] * batch, row_new_tokens=[0] * batch)
        state = DecodingState(
            canvas=canvas,
            canvas_mask=canvas_mask,
            positions=layout.positions(device),
            keys=row_keys(input_ids, prompt_mask),
            committed=torch.zeros(batch, dtype=torch.long, device=device),
            active=torch.arange(batch, device=device),
            cache=self._new_cache(),
            stats=stats,
            layout=layout,
        )
        answer_start, answer_end = layout.answer_start.to(device), layout.answer_end.to(device)
        decode_end = layout.decode_end.to(device)
        if streamer is not None:
            streamer.put(input_ids.cpu())

        # 2. blocks: the block decoder (stepwise, or an MRP mode) fills each block
        for start, end in layout.blocks:
            if state.active.numel() == 0:
                break
            state.block_forwards = 0
            if self.adapter.autoregressive_block_start and start % self.grid == 0:
                self._autoregressive_block_start(state, start)
            if self.refresh_commits_block_start:
                self._refresh_and_commit_block_start(state, start)
            self.block_decoder.decode_block(self, state, start, end)

            # 3. EOS stop, streamer
            state.guard.check()
            active = state.active
            new_tokens = (answer_end[active].clamp_max(end) - answer_start[active]).clamp(0, self.config.max_new_tokens)
            for row, count in zip(active.tolist(), new_tokens.tolist(), strict=True):
                stats.row_new_tokens[row] = count
            finished = self._eos_rows(canvas[active], answer_start[active], end) | (decode_end[active] <= end)
            if streamer is not None:
                self._stream_block(streamer, canvas[0], int(answer_start[0]), int(answer_end[0]), start, end)
            if finished.any():
                keep = (~finished).nonzero().squeeze(1)
                if state.cache is not None and self.adapter.exact_prefix_cache:
                    select_cache_rows(state.cache, keep)
                state.active = active[keep]

        # 4. sequences and stats
        if streamer is not None:
            streamer.end()
        return MRPGenerateOutput(sequences=self._sequences(input_ids, canvas, answer_start), stats=stats)

    def _lay_out(self, input_ids: torch.Tensor, prompt_mask: torch.Tensor, layout: CanvasLayout):
        """The canvas (pads, each row's real prompt tokens, mask tokens over its decoding region) and its 2-D
        attention mask (1 on the prompt and the decoding region)."""
        batch, prompt_len = input_ids.shape
        canvas = torch.full((batch, layout.length), self.pad_id, dtype=torch.long, device=input_ids.device)
        canvas_mask = torch.zeros_like(canvas)
        rows = zip(layout.pads.tolist(), layout.answer_start.tolist(), layout.decode_end.tolist(), strict=True)
        for row, (pads, answer_start, decode_end) in enumerate(rows):
            length = answer_start - pads
            canvas[row, pads:answer_start] = input_ids[row, prompt_len - length :]
            canvas[row, answer_start:decode_end] = self.mask_id
            canvas_mask[row, pads:decode_end] = 1
        return canvas, canvas_mask

    def _sequences(self, input_ids: torch.Tensor, canvas: torch.Tensor, answer_start: torch.Tensor) -> torch.Tensor:
        """The prompts as given, then each row's `max_new_tokens` answer tokens; after a row's first EOS, pad."""
        new = self.config.max_new_tokens
        columns = answer_start.unsqueeze(1) + torch.arange(new, device=canvas.device).unsqueeze(0)
        answers = canvas.gather(1, columns)
        if self.eos_ids:
            is_eos = torch.isin(answers, torch.tensor(self.eos_ids, device=canvas.device)).long()
            after_eos = (is_eos.cumsum(dim=1) - is_eos) > 0
            answers = answers.masked_fill(after_eos, self.pad_id)
        return torch.cat([input_ids, answers], dim=1)

    def _stream_block(self, streamer, row: torch.Tensor, answer_start: int, answer_end: int, start: int, end: int):
        """The answer tokens of the block just finished (pad after a first EOS, as in the returned sequences)."""
        first, last = max(start, answer_start), min(end, answer_end)
        if last <= first:
            return
        chunk = row[first:last]
        if self.eos_ids:
            is_eos = torch.isin(chunk, torch.tensor(self.eos_ids, device=chunk.device)).long()
            chunk = chunk.masked_fill((is_eos.cumsum(0) - is_eos) > 0, self.pad_id)
        streamer.put(chunk.cpu())

    def _eos_rows(self, rows_canvas: torch.Tensor, answer_start: torch.Tensor, end: int) -> torch.Tensor:
        """Bool [n]: rows whose answer up to column `end` holds an EOS."""
        if not self.eos_ids:
            return torch.zeros(rows_canvas.shape[0], dtype=torch.bool, device=rows_canvas.device)
        columns = torch.arange(end, device=rows_canvas.device).unsqueeze(0)
        is_eos = torch.isin(rows_canvas[:, :end], torch.tensor(self.eos_ids, device=rows_canvas.device))
        return (is_eos & (columns >= answer_start.unsqueeze(1))).any(dim=1)

    def _autoregressive_block_start(self, state: DecodingState, start: int) -> None:
        """Fast-dLLM v2's rule: a model block's first token is committed at once, as the argmax (or keyed draw)
        of the last logit of what precedes it, from a forward over the finished previous block (which also
        writes that block's KV), before any denoising step of the block. Rows whose answer starts later in the
        block (the prompt's tail holds its first position) decode it by denoising instead."""
        active = state.active
        needs = state.canvas[active, start] == self.mask_id
        if not bool(needs.any()):
            return
        out = self.forward(state, start, start + 1, step=0, has_work=needs, visible_end=start + 1)
        tokens, _ = self.propose(state, out.logits, start, start + 1, needs.unsqueeze(1), state.committed[active])
        column = state.canvas[active, start]
        state.canvas[active, start] = torch.where(needs, tokens[:, 0], column)
        state.committed[active] += needs.long()

    def _refresh_and_commit_block_start(self, state: DecodingState, start: int) -> None:
        """Fast-dLLM's cached Dream decoding: at a block's start, one forward over the whole canvas refreshes the
        approximate cache (the keys and values before the block, computed with the block still masked) and commits
        the block's first position from its logits (argmax or keyed draw, no confidence test); the block's steps
        then feed the block and what follows it against that cache."""
        active = state.active
        needs = state.canvas[active, start] == self.mask_id
        out = self.forward(state, start, start + 1, step=0, has_work=needs)
        tokens, _ = self.propose(state, out.logits, start, start + 1, needs.unsqueeze(1), state.committed[active])
        state.canvas[active, start] = torch.where(needs, tokens[:, 0], state.canvas[active, start])
        state.committed[active] += needs.long()

    # ------------------------------------------------------------------ pieces
    def _check_positions(self, layout: CanvasLayout, prompt_len: int) -> None:
        """Before anything is allocated: every row's laid-out prompt + decoding region must fit the model's
        positions (with implicit positions, the canvas columns themselves)."""
        limit, new = self.adapter.max_positions, self.config.max_new_tokens
        if limit is None:
            return
        if self.adapter.accepts_position_ids:
            last = layout.last_position()
        else:
            last = layout.length - 1
        if last >= limit:
            raise ValueError(
                f"prompt ({prompt_len} tokens, laid out to {int(layout.answer_start.max())}) + max_new_tokens ({new}) "
                f"needs position {last}, beyond the model's limit of {limit} positions; shorten the prompt or "
                f"lower max_new_tokens."
            )

    def _new_cache(self):
        if not self.use_cache:
            return None
        from transformers import DynamicCache

        return DynamicCache()

    def verify_layout(self) -> str:
        """The resolved `verify_layout` for this backbone: "stacked" or "packed" (see `forward`)."""
        wanted, adapter = self.config.verify_layout, self.adapter
        if wanted == "packed" and not adapter.can_pack:
            raise ValueError(
                f"verify_layout='packed' needs a backbone whose forward takes an explicit 4-D attention pattern and "
                f"position ids; the {adapter.family!r} family ({type(adapter.model).__name__}) does not. Use "
                f"verify_layout='stacked' (or 'auto', which picks the best layout the family supports)."
            )
        if wanted != "auto":
            return wanted
        if not adapter.can_pack or (self.grid is None and not self.use_cache):
            return "stacked"  # bidirectional without a cache: the copies would share no prefix
        return adapter.preferred_verify_layout

    def forward(self, state: DecodingState, start: int, end: int, step: int, output_hidden_states: bool = False,
                canvas: torch.Tensor | None = None, copies: int = 1, has_work: torch.Tensor | None = None,
                layout: str = "stacked", visible_end: int | None = None) -> BackboneOutput:
        """One counted backbone forward for the current block of every active row.

        Returns the block's aligned logits (and hidden states when asked). `canvas` replaces the active rows'
        canvas with `copies` candidate versions of each row, stacked row-major ([n * copies, T]), which
        differ only inside the block: the speculative verifier evaluates several candidate states of the
        block in this one forward. `layout="stacked"` runs them as n * copies rows (the prefix cache repeated
        per copy); `layout="packed"` runs n rows, each the shared prefix once followed by the copies'
        segments, with block-diagonal attention (`_packed_forward`). The block outputs come back
        [n * copies, L, ...] either way, and the cache comes out the same.

        Without cache the input is the canvas up to the end of the model block that holds the decoding block
        (block-causal: later blocks cannot be seen, and the block's later sub-blocks are part of what the model
        reads, still masked, as in its training and its own generate) or the whole canvas (bidirectional);
        `visible_end` overrides that end. With the exact block-causal cache the input starts at the first
        uncached position; the cache is then cropped back to the last model-block boundary before the block,
        so in-block forwards never stay in it. With the approximate bidirectional cache the first step of a
        block refreshes the whole prefix and later steps feed only the block and what follows it.
        """
        adapter, active = self.adapter, state.active
        shift = 1 if adapter.shifted_logits else 0
        every_row = active.numel() == state.canvas.shape[0]  # the common case: skip the row gathers
        if canvas is None:
            canvas = state.canvas if every_row else state.canvas[active]
        canvas_mask = state.canvas_mask if every_row else state.canvas_mask[active]
        positions = state.positions if every_row else state.positions[active]
        if visible_end is None:
            visible_end = min(-(-end // self.grid) * self.grid, canvas.shape[1]) if adapter.block_causal else canvas.shape[1]
        cache = state.cache
        if cache is not None and cache_length(cache) == 0:
            # an empty cache may keep a stale batch size (transformers skips row selection on empty layers)
            cache = state.cache = self._new_cache()
        if cache is not None and not adapter.exact_prefix_cache and state.block_forwards == 0:
            cache = state.cache = self._new_cache()  # approximate cache: refreshed by each block's first forward
        state.block_forwards += 1
        in_start = cache_length(cache)
        grid = self.grid or 1
        # the cache is cropped back to this many positions (the block's first position is committed by the refresh
        # forward when `refresh_commits_block_start`: the output that would score it is not needed)
        keep = start if self.refresh_commits_block_start else max(0, min((start // grid) * grid, start - shift))
        if copies > 1 and layout == "packed":
            out = self._packed_forward(canvas, canvas_mask, positions, cache, copies, start, end, visible_end,
                                       keep, output_hidden_states)
        else:
            if copies > 1:
                canvas_mask = canvas_mask.repeat_interleave(copies, dim=0)
                positions = positions.repeat_interleave(copies, dim=0)
                if cache is not None:
                    cache.batch_repeat_interleave(copies)
            out = adapter.forward(
                canvas[:, in_start:visible_end],
                attention_mask=canvas_mask[:, :visible_end],
                position_ids=positions[:, in_start:visible_end],
                past_key_values=cache,
                output_hidden_states=output_hidden_states,
                grid=self.grid,
            )
            block = slice(start - in_start, end - in_start)
            hidden = out.hidden_states[:, block] if out.hidden_states is not None else None
            out = BackboneOutput(logits=out.logits[:, block], hidden_states=hidden)
            if cache is not None:
                crop_cache(cache, keep)
                if copies > 1:
                    select_cache_rows(cache, torch.arange(0, canvas.shape[0], copies, device=canvas.device))
        state.guard.watch(BACKBONE_PART, out.logits)
        state.stats.backbone_forwards += 1
        if has_work is None:  # rows that still had masked positions in the block: the forward was for them
            has_work = (state.canvas[active, start:end] == self.mask_id).any(dim=1)
        for row, work in zip(active.tolist(), has_work.tolist(), strict=True):
            state.stats.row_backbone_forwards[row] += work
        return out

    def _packed_forward(self, canvas, canvas_mask, positions, cache, copies, start, end, visible_end, keep,
                        output_hidden_states) -> BackboneOutput:
        """The candidate versions of each row's block packed into one sequence per row.

        Each of the n rows is fed as [shared | copy 0 | copy 1 | ...]: `shared` is the uncached input that no
        copy can influence, copy j the j-th candidate's positions from `shared_end` to the visible end, with
        the same position ids in every copy. A query of copy j sees the cache, `shared` and copy j only, under
        the family's usual rule (padding, and the block-causal grid) applied to canvas positions, so each
        copy computes exactly what its own row computes in the stacked layout:
        - block-causal: what lies before the model block holding `start - shift` cannot see the block, so it
          is shared (it is also what the cache keeps); the copies hold the rest up to the block end;
        - bidirectional: every position attends to the block, so nothing uncached is shared and each copy
          holds everything from the cache end (the whole canvas without a cache, or the block and what
          follows it with the approximate cache).
        The cache gets shared + copy 0 appended and is cropped back to `keep` positions, which never reach
        past copy 0's unchanged part (positions before `start`), so it ends exactly as after a stacked verify.
        """
        adapter, grid = self.adapter, self.grid
        shift = 1 if adapter.shifted_logits else 0
        n, width = canvas.shape[0] // copies, canvas.shape[1]
        in_start = cache_length(cache)
        shared_end = max(in_start, ((start - shift) // grid) * grid) if grid else in_start
        # a shifted block's first scored position must get its logit from its own copy (not needed when the cache
        # refresh already committed the block's first position)
        first_scored = start + 1 if self.refresh_commits_block_start else start
        if shared_end > first_scored - shift:
            raise RuntimeError(f"cannot pack the verify forward: cache {in_start}, block [{start}, {end}), keep {keep}")
        length = visible_end - shared_end  # one copy's segment
        rows = canvas.view(n, copies, width)
        input_ids = torch.cat([rows[:, 0, in_start:shared_end], rows[:, :, shared_end:visible_end].reshape(n, -1)], dim=1)
        position_ids = torch.cat([positions[:, in_start:shared_end], positions[:, shared_end:visible_end].repeat(1, copies)], dim=1)
        device = canvas.device
        key_pos = torch.cat([torch.arange(shared_end, device=device), torch.arange(shared_end, visible_end, device=device).repeat(copies)])
        key_copy = torch.cat([torch.full((shared_end,), -1, device=device),
                              torch.arange(copies, device=device).repeat_interleave(length)])
        query_pos, query_copy = key_pos[in_start:], key_copy[in_start:]
        same = (key_copy[None, :] < 0) | (key_copy[None, :] == query_copy[:, None])
        if grid:
            same &= key_pos[None, :] // grid <= query_pos[:, None] // grid
        pattern = canvas_mask[:, key_pos].bool()[:, None, None, :] & same[None, None]
        out = adapter.forward(input_ids, position_ids=position_ids, past_key_values=cache,
                              output_hidden_states=output_hidden_states, grid=grid, pattern=pattern)
        if cache is not None:
            crop_cache(cache, keep)
        shared, block = shared_end - in_start, slice(start - shared_end, end - shared_end)

        def per_copy(x):
            return x[:, shared:].reshape(n, copies, length, -1)[:, :, block].reshape(n * copies, end - start, -1)

        hidden = per_copy(out.hidden_states) if out.hidden_states is not None else None
        return BackboneOutput(logits=per_copy(out.logits), hidden_states=hidden)

    def propose(self, state: DecodingState, logits: torch.Tensor, start: int, end: int,
                masked: torch.Tensor, committed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens and confidences for the block; confidence is -inf where nothing is masked."""
        key, block_positions = self._draw_keys(state, start, end)
        tokens, confidence = self.proposer(logits, key, block_positions, committed.unsqueeze(1))
        return tokens, confidence.masked_fill(~masked, float("-inf"))

    def confidence_of(self, state: DecodingState, logits: torch.Tensor, tokens: torch.Tensor, start: int, end: int):
        """The proposer's confidence for given tokens of the block under other logits (e.g. head-corrected)."""
        key, block_positions = self._draw_keys(state, start, end)
        return self.proposer.confidence_of(logits, tokens, key, block_positions, state.committed[state.active].unsqueeze(1))

    @staticmethod
    def _draw_keys(state: DecodingState, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row keys [n, 1] of the active rows and their answer positions [n, L] in the block: what random draws
        key on (a row's answer position does not depend on where the batch put the row)."""
        columns = torch.arange(start, end, device=state.keys.device).unsqueeze(0)
        answer_start = state.layout.answer_start.to(state.keys.device)[state.active]
        return state.keys[state.active].unsqueeze(1), columns - answer_start.unsqueeze(1)
