"""The block loop shared by every decoding mode: canvas, prefix cache, EOS stop, batches, stats."""

from __future__ import annotations

from typing import Any

import torch
from transformers.utils import logging

from .._compat import cache_length, crop_cache, select_cache_rows
from ..backbones.base import BackboneAdapter, BackboneOutput
from .block import BlockContext
from .config import MRPGenerationConfig
from .guard import BACKBONE_PART
from .inputs import validate_prompt
from .layout import CanvasLayout, plan_layout
from .modes import build_decoder
from .packed import PackedPatterns, packed_forward
from .sampling import TokenProposer, row_keys
from .state import DecodingState, GenerationStats, MRPGenerateOutput, StatCounters
from .strategies import BlockDecoder, DynamicStrategy, RevealStrategy, StaticStrategy
from .streaming import AnswerStream

logger = logging.get_logger(__name__)

__all__ = ["DecodingEngine", "GenerationStats", "MRPGenerateOutput", "validate_prompt"]


class DecodingEngine:
    """Runs block-wise masked-diffusion decoding of one batch with one block decoder (`mrp_mode`).

    The steps below are the numbered steps of `MRPModel.generate`'s docstring:

    1. Lay out the canvas (`plan_layout`): each row's prompt, then its answer region of mask tokens, with the
       family's block alignment (block-causal families count blocks from each row's first token, as their own
       generate functions do; the reference DLM and bidirectional families start blocks at the answer);
       position ids per row. Rows that must not share a padded batch are decoded in groups of equal length.
    2. For each decoding block, while a row still has masked positions in it:
       a. one backbone forward over the visible part of the canvas (block-causal: up to the end of the model
          block holding it; with the prefix cache when on); families that commit a block's first token
          autoregressively (Fast-dLLM v2) get that forward and token first; a speculative decoder's last verify
          of the previous block may have computed the block's first outputs already (`can_carry`);
       b. propose a token and a confidence per position (`TokenProposer`);
       c. the block decoder picks the positions to reveal and commits them (`BlockContext`).
    3. After each block: rows whose answer holds EOS, whose `stopping_criteria` fire, or whose last block is done,
       stop (the rest of their answer becomes pad) and leave the batch and the cache; the confirmed answer tokens
       go to the streamer (drafts go to its `put_draft` after each commit, `generation/streaming.py`).
    4. Return the sequences (prompt + `max_new_tokens` answer tokens per row) and the stats.

    `logits_processor` (a transformers `LogitsProcessorList`) is applied to every proposal's logits before the
    confidence and the pick, with the scores of a block [rows, block length, vocab] (transformers' diffusion
    convention) and `input_ids` = each row's canvas before the block (prompt and finished blocks): the same for the
    head's drafts, the verifier and static decoding, so speculative decoding stays lossless.
    """

    def __init__(self, adapter: BackboneAdapter, config: MRPGenerationConfig, head: Any = None,
                 block_decoder: BlockDecoder | None = None, logits_processor=None, stopping_criteria=None):
        self.adapter = adapter
        self.config = config
        self.logits_processor = _as_list(logits_processor, "LogitsProcessorList")
        self.stopping_criteria = _as_list(stopping_criteria, "StoppingCriteriaList")
        self.mask_id = adapter.mask_token_id
        self.alignment = self._resolve_alignment()
        self.block_length = self._resolve_block_length()
        self.num_blocks = -(-config.max_new_tokens // self.block_length)
        self.block_decoder = block_decoder or build_decoder(config, head, self._default_strategy)
        self.proposer = TokenProposer(config, self.mask_id)
        self.use_cache = self._resolve_cache()
        self.refresh_commits_block_start = (
            self.use_cache and not adapter.exact_prefix_cache and adapter.commits_block_start_on_cache_refresh
        )
        self.input_vocab_size = adapter.get_input_embeddings().weight.shape[0]
        self.eos_ids, self.pad_id = self._resolve_token_ids()
        self._patterns = PackedPatterns()

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
        cfg = self.config
        block_length = self.adapter.resolve_block_length(cfg.block_length, cfg.max_new_tokens)
        if self.alignment == "answer" and cfg.max_new_tokens % block_length:
            raise ValueError(
                f"block_length={block_length} does not divide max_new_tokens={cfg.max_new_tokens}; use a "
                f"max_new_tokens that is a multiple of it (e.g. {-(-cfg.max_new_tokens // block_length) * block_length}), "
                f"or another block_length."
            )
        return block_length

    def _default_strategy(self) -> RevealStrategy:
        """The backbone's own reveal rule: dynamic with `threshold`, else static (`steps` or `tokens_per_step`)."""
        cfg = self.config
        if cfg.threshold is not None:
            return DynamicStrategy(cfg.threshold, inclusive=self.adapter.threshold_inclusive)
        if cfg.steps is None:
            if cfg.step_schedule != "even":
                raise ValueError(f"step_schedule={cfg.step_schedule!r} spreads a block over a number of steps: pass steps.")
            return StaticStrategy(tokens_per_step=cfg.tokens_per_step)
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

    def _resolve_token_ids(self) -> tuple[list[int], int]:
        """EOS ids (a warning for ids the model cannot produce) and the pad id (must be a token of the model)."""
        vocab = self.input_vocab_size
        eos = self.config.eos_token_id
        eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        outside = [i for i in eos_ids if not 0 <= i < vocab]
        if outside:  # e.g. a config written for a larger vocabulary: harmless, but rows will not stop at it
            logger.warning_once(
                f"eos_token_id {outside} is outside this model's vocabulary (ids 0 to {vocab - 1}) and can never be "
                f"generated: rows will not stop early at it. Pass the tokenizer's eos_token_id."
            )
        pad = self.config.pad_token_id
        if pad is not None and not 0 <= pad < vocab:
            raise ValueError(
                f"pad_token_id={pad} is not a token id of this model (ids run from 0 to {vocab - 1}); "
                f"pass the tokenizer's pad_token_id."
            )
        in_vocab_eos = [i for i in eos_ids if 0 <= i < vocab]
        return eos_ids, pad if pad is not None else (in_vocab_eos[0] if in_vocab_eos else self.mask_id)

    @property
    def grid(self) -> int | None:
        """Block size of the model's block-causal attention (None: bidirectional)."""
        if not self.adapter.block_causal:
            return None
        return self.adapter.block_size or self.block_length

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

    # ------------------------------------------------------------------ run
    @torch.no_grad()
    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, streamer=None) -> MRPGenerateOutput:
        prompt_mask = validate_prompt(input_ids, attention_mask, self.input_vocab_size, self.mask_id)
        lengths = prompt_mask.sum(dim=1).tolist()
        groups = self._groups(lengths)
        if streamer is not None and len(groups) > 1:
            raise ValueError(
                f"streamer: the {self.adapter.family} family decodes this batch in {len(groups)} groups of equal prompt "
                f"length (its attention ignores padding), so it cannot stream the batch in order; stream one prompt at "
                f"a time, or pass group_by_prompt_length=False."
            )
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

    def _groups(self, lengths: list[int]) -> list[list[int]]:
        """Rows decoded together: all of them, or (families whose attention ignores padding, under the answer
        alignment) groups of equal prompt length, which need no padding at all."""
        cannot_pad = not self.adapter.supports_padding and self.alignment == "answer"
        group = self.config.group_by_prompt_length
        if group is None:
            group = cannot_pad
        if not group or len(set(lengths)) == 1:
            if cannot_pad and len(set(lengths)) > 1:
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

    def _check_positions(self, layout: CanvasLayout, prompt_len: int) -> None:
        """Before anything is allocated: every row's laid-out prompt + decoding region must fit the model's
        positions (with implicit positions, the canvas columns themselves)."""
        limit, new = self.adapter.max_positions, self.config.max_new_tokens
        if limit is None:
            return
        last = layout.last_position() if self.adapter.accepts_position_ids else layout.length - 1
        if last >= limit:
            raise ValueError(
                f"prompt ({prompt_len} tokens, laid out to {max(layout.answer_start)}) + max_new_tokens ({new}) "
                f"needs position {last}, beyond the model's limit of {limit} positions; shorten the prompt or "
                f"lower max_new_tokens."
            )

    def _run_batch(self, input_ids: torch.Tensor, prompt_mask: torch.Tensor, layout: CanvasLayout,
                   streamer) -> MRPGenerateOutput:
        # 1. canvas, attention mask and positions
        state = self._new_state(input_ids, prompt_mask, layout)
        if streamer is not None:
            state.stream = AnswerStream(streamer, self.config.max_new_tokens, self._answers)
            state.stream.prompt(input_ids)
        # 2. blocks: the block decoder (stepwise, or an MRP mode) fills each block
        blocks = list(layout.blocks)  # contiguous: each starts where the one before ends
        for index, (start, end) in enumerate(blocks):
            if state.active.numel() == 0:
                break
            state.block_forwards = 0
            next_block = blocks[index + 1] if index + 1 < len(blocks) and self.can_carry else None
            if self.adapter.autoregressive_block_start and start % self.grid == 0:
                self._autoregressive_block_start(state, start)
            if self.refresh_commits_block_start:
                self._refresh_and_commit_block_start(state, start)
            self.block_decoder.decode_block(BlockContext(self, state, start, end, next_block))
            # 3. EOS stop, stopping criteria, streamer
            self._finish_block(state, end)
        # 4. sequences and stats
        if state.stream is not None:
            state.stream.finish()
        sequences = self._sequences(input_ids, state)
        return MRPGenerateOutput(sequences=sequences, stats=state.counters.finish())

    def _new_state(self, input_ids: torch.Tensor, prompt_mask: torch.Tensor, layout: CanvasLayout) -> DecodingState:
        device, batch = input_ids.device, input_ids.shape[0]
        canvas, canvas_mask = self._lay_out(input_ids, prompt_mask, layout)
        return DecodingState(
            canvas=canvas,
            canvas_mask=canvas_mask,
            positions=layout.positions(device),
            keys=self._row_keys(input_ids, prompt_mask),
            committed=torch.zeros(batch, dtype=torch.long, device=device),
            active=torch.arange(batch, device=device),
            cache=self._new_cache(),
            counters=StatCounters(batch, device),
            layout=layout,
            answer_start=layout.tensor("answer_start", device),
            answer_end=layout.tensor("answer_end", device),
            decode_end=layout.tensor("decode_end", device),
            stop_column=torch.full((batch,), layout.length, dtype=torch.long, device=device),
        )

    def _row_keys(self, input_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        """What the keyed random draws of each row hash (from its prompt); greedy decoding draws nothing, so it
        skips reading the prompt back from the device."""
        if self.config.is_sampling or self.config.confidence == "random":
            return row_keys(input_ids, prompt_mask)
        return torch.zeros(input_ids.shape[0], dtype=torch.long, device=input_ids.device)

    def _lay_out(self, input_ids: torch.Tensor, prompt_mask: torch.Tensor, layout: CanvasLayout):
        """The canvas (pads, each row's real prompt tokens, mask tokens over its decoding region) and its 2-D
        attention mask (1 on the prompt and the decoding region)."""
        batch, prompt_len = input_ids.shape
        canvas = torch.full((batch, layout.length), self.pad_id, dtype=torch.long, device=input_ids.device)
        canvas_mask = torch.zeros_like(canvas)
        rows = zip(layout.pads, layout.answer_start, layout.decode_end, strict=True)
        for row, (pads, answer_start, decode_end) in enumerate(rows):
            length = answer_start - pads
            canvas[row, pads:answer_start] = input_ids[row, prompt_len - length :]
            canvas[row, answer_start:decode_end] = self.mask_id
            canvas_mask[row, pads:decode_end] = 1
        return canvas, canvas_mask

    def _finish_block(self, state: DecodingState, end: int) -> None:
        """Step 3 after the block ending at column `end`: count the rows' new tokens; rows whose answer holds an EOS,
        whose stopping criteria fire, or whose last block is done leave the batch and the cache. One read of the
        device: the finished rows (and whether a model part produced non-finite logits)."""
        active, device = state.active, state.canvas.device
        answer_start, answer_end = state.answer_start[active], state.answer_end[active]
        new_tokens = (answer_end.clamp_max(end) - answer_start).clamp(0, self.config.max_new_tokens)
        state.counters.row_new_tokens[active] = new_tokens
        finished = self._eos_rows(state.canvas[active], answer_start, end) | (state.decode_end[active] <= end)
        if self.stopping_criteria:  # transformers' criteria see each row's ids so far (left-padded) and no scores
            stopped = self.stopping_criteria(state.canvas[active, :end], None).to(device=device, dtype=torch.bool)
            state.stop_column[active] = torch.where(stopped, end, state.stop_column[active])
            finished = finished | stopped
        bad = state.guard.flag()
        read = torch.cat([finished, bad.view(1) if bad is not None else finished.new_zeros(1)]).tolist()  # the read
        if read[-1]:
            state.guard.check()  # raises, naming the model part
        if any(read[:-1]):
            keep = torch.tensor([i for i, done in enumerate(read[:-1]) if not done], dtype=torch.long, device=device)
            if state.cache is not None and self.adapter.exact_prefix_cache:
                select_cache_rows(state.cache, keep)
            if state.carried is not None:
                carried_start, out, exact = state.carried
                state.carried = (carried_start, BackboneOutput(
                    logits=out.logits[keep], lm_head_input=None if out.lm_head_input is None else out.lm_head_input[keep]
                ), exact[keep])
            state.active = active[keep]
        if state.stream is not None:
            state.stream.block_done(state, end, active.tolist(), state.active.tolist())

    def _eos_rows(self, rows_canvas: torch.Tensor, answer_start: torch.Tensor, end: int) -> torch.Tensor:
        """Bool [n]: rows whose answer up to column `end` holds an EOS."""
        if not self.eos_ids:
            return torch.zeros(rows_canvas.shape[0], dtype=torch.bool, device=rows_canvas.device)
        columns = torch.arange(end, device=rows_canvas.device).unsqueeze(0)
        is_eos = torch.isin(rows_canvas[:, :end], torch.tensor(self.eos_ids, device=rows_canvas.device))
        return (is_eos & (columns >= answer_start.unsqueeze(1))).any(dim=1)

    def _answers(self, state: DecodingState, length: int) -> torch.Tensor:
        """The first `length` answer tokens of every row [batch, length], as returned: pad after a row's first EOS
        and from the column where its stopping criteria fired."""
        columns = state.answer_start.unsqueeze(1) + torch.arange(length, device=state.canvas.device).unsqueeze(0)
        answers = state.canvas.gather(1, columns)
        cut = columns >= state.stop_column.unsqueeze(1)
        if self.eos_ids:
            is_eos = torch.isin(answers, torch.tensor(self.eos_ids, device=answers.device)).long()
            cut = cut | ((is_eos.cumsum(dim=1) - is_eos) > 0)
        return answers.masked_fill(cut, self.pad_id)

    def _sequences(self, input_ids: torch.Tensor, state: DecodingState) -> torch.Tensor:
        """The prompts as given, then each row's `max_new_tokens` answer tokens (pad after its EOS or stop)."""
        return torch.cat([input_ids, self._answers(state, self.config.max_new_tokens)], dim=1)

    # ------------------------------------------------------------------ block-start rules of some families
    def _autoregressive_block_start(self, state: DecodingState, start: int) -> None:
        """Fast-dLLM v2's rule: a model block's first token is committed at once, as the argmax (or keyed draw)
        of the last logit of what precedes it, from a forward over the finished previous block (which also
        writes that block's KV), before any denoising step of the block. Rows whose answer starts later in the
        block (the prompt's tail holds its first position) decode it by denoising instead."""
        self._commit_block_start(state, start, visible_end=start + 1)

    def _refresh_and_commit_block_start(self, state: DecodingState, start: int) -> None:
        """Fast-dLLM's cached Dream decoding: at a block's start, one forward over the whole canvas refreshes the
        approximate cache (the keys and values before the block, computed with the block still masked) and commits
        the block's first position from its logits (argmax or keyed draw, no confidence test); the block's steps
        then feed the block and what follows it against that cache."""
        self._commit_block_start(state, start, visible_end=None)

    def _commit_block_start(self, state: DecodingState, start: int, visible_end: int | None) -> None:
        active = state.active
        needs = state.canvas[active, start] == self.mask_id
        out = self.forward(state, start, start + 1, has_work=needs, visible_end=visible_end)
        tokens, _ = self.propose(state, out.logits, start, start + 1, needs.unsqueeze(1), state.committed[active])
        state.canvas[active, start] = torch.where(needs, tokens[:, 0], state.canvas[active, start])
        state.committed[active] += needs.long()

    # ------------------------------------------------------------------ the counted backbone forward
    def _new_cache(self):
        if not self.use_cache:
            return None
        from transformers import DynamicCache

        return DynamicCache()

    def _cache_keep(self, start: int) -> int:
        """How many positions the cache keeps after a forward for a block starting at `start`: the whole model
        blocks before it, and never the input position whose output scores `start` (shifted families); all
        positions before `start` when the cache refresh commits the block's first position."""
        if self.refresh_commits_block_start:
            return start
        grid = self.grid or 1
        return max(0, min((start // grid) * grid, self.adapter.first_scoring_position(start)))

    def forward(self, state: DecodingState, start: int, end: int, return_lm_head_input: bool = False,
                canvas: torch.Tensor | None = None, copies: int = 1, has_work: torch.Tensor | None = None,
                layout: str = "stacked", visible_end: int | None = None,
                lookahead: tuple[int, int] | None = None) -> BackboneOutput | tuple[BackboneOutput, BackboneOutput]:
        """One counted backbone forward for the block [start, end) of every active row; returns its aligned logits
        (and hidden states when asked).

        `canvas` replaces the active rows' canvas with `copies` candidate versions of each row, stacked row-major
        ([n * copies, T]), which differ only inside the block: `layout="stacked"` runs them as n * copies rows
        (the prefix cache repeated per copy), `layout="packed"` as n rows with block-diagonal attention
        (generation/packed.py); the outputs come back [n * copies, L, ...] and the cache ends the same either way.

        The input runs to `visible_end`: by default the end of the model block holding the block (block-causal:
        later blocks cannot be seen, and the block's later sub-blocks are read still masked, as in the model's
        training and its own generate), or the whole canvas (bidirectional). With the exact cache the input
        starts at the first uncached position and the cache is then cropped back (`_cache_keep`), so in-block
        forwards never stay in it; the approximate cache is refreshed by each block's first forward.

        `lookahead` = the next decoding block (start, end): the last copy also runs over it (still masked), and
        its outputs there come back second, [n, next length, ...]: exactly what the next block's first forward
        computes if the last copy is what this block becomes (`can_carry`).
        """
        adapter, active = self.adapter, state.active
        every_row = state.every_row_active
        if canvas is None:
            canvas = state.canvas if every_row else state.canvas[active]
        canvas_mask = state.canvas_mask if every_row else state.canvas_mask[active]
        positions = state.positions if every_row else state.positions[active]
        if visible_end is None:
            visible_end = self._visible_end(end, canvas.shape[1])
        ahead = (*lookahead, self._visible_end(lookahead[1], canvas.shape[1])) if lookahead else None
        cache = state.cache
        if cache is not None and (cache_length(cache) == 0 or (not adapter.exact_prefix_cache and state.block_forwards == 0)):
            # an empty cache may keep a stale batch size (transformers skips row selection on empty layers); the
            # approximate cache is refreshed by each block's first forward
            cache = state.cache = self._new_cache()
        state.block_forwards += 1
        keep = self._cache_keep(start)
        if copies > 1 and layout == "packed":
            first_scored = start + 1 if self.refresh_commits_block_start else start
            out, ahead_out = packed_forward(adapter, self._patterns, canvas, canvas_mask, positions, cache, copies,
                                            (start, end, visible_end), keep, first_scored, self.grid,
                                            return_lm_head_input, ahead)
        else:
            out, ahead_out = self._stacked_forward(canvas, canvas_mask, positions, cache, copies, (start, end, visible_end),
                                                   keep, return_lm_head_input, ahead)
        state.guard.watch(BACKBONE_PART, out.logits)
        state.counters.backbone_forwards += 1
        if has_work is None:  # rows that still had masked positions in the block: the forward was for them
            has_work = (state.canvas[active, start:end] == self.mask_id).any(dim=1)
        state.counters.row_backbone_forwards[active] += has_work.long()
        if lookahead is None:
            return out
        state.guard.watch(BACKBONE_PART, ahead_out.logits)
        return out, ahead_out

    def _visible_end(self, end: int, width: int) -> int:
        """Where the input of a forward for a block ending at `end` stops: the end of the model block holding it
        (block-causal), or the canvas's end (bidirectional)."""
        return min(-(-end // self.grid) * self.grid, width) if self.adapter.block_causal else width

    @property
    def can_carry(self) -> bool:
        """Whether a verify forward's lookahead may stand in for the next block's first forward: `verify_lookahead`
        is on, and the forward over [what precedes the block | the finished block | the next block, masked] is the
        same computation either way, which the exact prefix cache (or none) gives, and no block-start rule may run first (Fast-dLLM
        v2's autoregressive first token, the approximate cache's refresh)."""
        adapter = self.adapter
        return self.config.verify_lookahead and not (adapter.autoregressive_block_start or self.refresh_commits_block_start
                                                     or (self.use_cache and not adapter.exact_prefix_cache))

    def _stacked_forward(self, canvas, canvas_mask, positions, cache, copies, span, keep, return_lm_head_input,
                         lookahead=None):
        start, end, visible_end = span
        if lookahead:  # every copy runs to the next block's visible end (rows of one batch share a width)
            visible_end = max(visible_end, lookahead[2])
        if copies > 1:
            canvas_mask = canvas_mask.repeat_interleave(copies, dim=0)
            positions = positions.repeat_interleave(copies, dim=0)
            if cache is not None:
                cache.batch_repeat_interleave(copies)
        in_start = cache_length(cache)
        out = self.adapter.forward(
            canvas[:, in_start:visible_end],
            attention_mask=canvas_mask[:, :visible_end],
            position_ids=positions[:, in_start:visible_end],
            past_key_values=cache,
            return_lm_head_input=return_lm_head_input,
            grid=self.grid,
        )
        if cache is not None:
            crop_cache(cache, keep)
            if copies > 1:
                select_cache_rows(cache, torch.arange(0, canvas.shape[0], copies, device=canvas.device))

        def part(x, first, last, rows=slice(None)):
            return None if x is None else x[rows, first - in_start : last - in_start]

        block = BackboneOutput(logits=part(out.logits, start, end), lm_head_input=part(out.lm_head_input, start, end))
        if not lookahead:
            return block, None
        last = slice(copies - 1, None, copies)
        return block, BackboneOutput(logits=part(out.logits, *lookahead[:2], last),
                                     lm_head_input=part(out.lm_head_input, *lookahead[:2], last))

    # ------------------------------------------------------------------ proposals
    def propose(self, state: DecodingState, logits: torch.Tensor, start: int, end: int,
                masked: torch.Tensor, committed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens and confidences for the block ([n, L], or [n, c, L] for logits [n, c, L, V] of c candidate
        states, with `committed` [n, c]); confidence is -inf where nothing is masked."""
        key, block_positions = self._draw_keys(state, start, end)
        logits = self._processed(state, logits, start)
        if logits.dim() == 4:  # candidate states: each copy draws with its row's key at its own committed count
            n, copies = logits.shape[:2]
            tokens, confidence = self.proposer(
                logits.flatten(0, 1), key.repeat_interleave(copies, dim=0),
                block_positions.repeat_interleave(copies, dim=0), committed.reshape(-1, 1),
            )
            tokens, confidence = tokens.view(n, copies, -1), confidence.view(n, copies, -1)
        else:
            tokens, confidence = self.proposer(logits, key, block_positions, committed.unsqueeze(1))
        return tokens, confidence.masked_fill(~masked, float("-inf"))

    def confidence_of(self, state: DecodingState, logits: torch.Tensor, tokens: torch.Tensor, start: int, end: int):
        """The proposer's confidence for given tokens of the block under other logits (e.g. head-corrected)."""
        key, block_positions = self._draw_keys(state, start, end)
        logits = self._processed(state, logits, start)
        return self.proposer.confidence_of(logits, tokens, key, block_positions, state.committed[state.active].unsqueeze(1))

    def _processed(self, state: DecodingState, logits: torch.Tensor, start: int) -> torch.Tensor:
        """`logits_processor` over a block's logits [n, L, V] (or [n, c, L, V]), in float32; `input_ids` are the
        active rows' canvas before the block, which no step inside the block changes."""
        if not self.logits_processor:
            return logits
        input_ids = state.canvas[state.active, :start]
        if logits.dim() == 4:
            n, copies = logits.shape[:2]
            scores = self.logits_processor(input_ids.repeat_interleave(copies, dim=0), logits.flatten(0, 1).float())
            return scores.view(logits.shape)
        return self.logits_processor(input_ids, logits.float())

    @staticmethod
    def _draw_keys(state: DecodingState, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row keys [n, 1] of the active rows and their answer positions [n, L] in the block: what random draws
        key on (a row's answer position does not depend on where the batch put the row)."""
        columns = torch.arange(start, end, device=state.keys.device).unsqueeze(0)
        return state.keys[state.active].unsqueeze(1), columns - state.answer_start[state.active].unsqueeze(1)


def _as_list(items, list_class: str):
    """A transformers `LogitsProcessorList` / `StoppingCriteriaList` (a plain list is wrapped), or None if empty."""
    if not items:
        return None
    import transformers

    wrapper = getattr(transformers, list_class)
    return items if isinstance(items, wrapper) else wrapper(items)
