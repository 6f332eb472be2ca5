"""`train_head` / `Trainer`: train an MRP head on a frozen diffusion LM backbone with `accelerate`.

The same code runs on one CPU, one GPU, or many GPUs under `accelerate launch -m mrp_hf.train` (DDP or
FSDP): the head, its optimizer, the data loader and the LR schedule go through `Accelerator.prepare`; the
frozen backbone is moved to the process's device (it has no gradients, so DDP needs no wrapper), or under
FSDP its transformer layers are sharded over the processes (`training/distributed.py`).

Steps of a run (`Trainer.train`; each is a method of `Trainer`):
    1. Accelerator; the output folder (`prepare_output_dir`: refuse to start over a checkpoint or a trained
       head without `resume` / `overwrite`; with `resume`, a finished run returns its head); the records
       (every one checked, with file and line); seeds; the backbone (frozen, eval mode), its adapter,
       tokenizer and mask id (`setup_backbone`).
    2. Data: records -> samples (ids checked against the vocabulary) -> rows (padding or packing), the
       held-out split, data loaders (`setup_data`).
    3. The head (`MRPConfig.for_backbone`, `setup_head`), the objective, AdamW, transformers' cosine schedule
       with warm-up; `prepare` (`setup_optimization`).
    4. Resume from `output_dir/checkpoint` (weights, optimizer, schedule, RNG states, data position: `resume`);
       or, with `overwrite`, delete the earlier run's checkpoint and head (`clear_output_dir`).
    5. The loop (`train_loop` / `train_epoch`): per micro-batch `train_step` (targets from 2 frozen backbone
       forwards, K + 1 with K chained steps; head forward, backward, clip, step); per optimizer step progress,
       held-out evaluation and atomic checkpoints every N steps, SIGINT / SIGTERM checkpoint and stop
       (`between_steps`, `evaluate`, `checkpoint`).
    6. A checkpoint of the last step; final held-out evaluation; the head (`save_pretrained`) with the metrics
       in its config and in `training_metrics.json`, written atomically (`save_final`); the checkpoint is removed
       (`save`).
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers.utils import logging

from ..backbones import get_adapter, load_backbone
from ..backbones.loading import resolve_dtype
from ..configuration_mrp import MRPConfig
from ..modeling_mrp import MRPHead
from .checkpoint import (
    CHECKPOINT,
    clear_output_dir,
    find_checkpoint,
    load_checkpoint,
    prepare_output_dir,
    remove_checkpoints,
    save_checkpoint,
    save_final,
    state_nbytes,
)
from .config import MRPTrainingConfig
from .data import (
    EpochSampler,
    RecordTokenizer,
    RowBuilder,
    RowCollator,
    RowDataset,
    describe_rows,
    read_records,
    split_records,
    tokenize_records,
)
from .distributed import (
    fsdp_version,
    full_model_state,
    full_optimizer_state,
    load_full_model_state,
    load_full_optimizer_state,
    shard_backbone,
    split_wrap_classes,
)
from .objective import AgreementMeter, HeadChain, MRPObjective

logger = logging.get_logger(__name__)


class TrainingInterrupted(Exception):
    """Raised by `train_head` after it checkpointed because of SIGINT / SIGTERM or `stop_after`."""

    def __init__(self, step: int, checkpoint: str | None, reason: str):
        super().__init__(f"training stopped at step {step} ({reason}); checkpoint: {checkpoint}. Resume with resume=True.")
        self.step = step
        self.checkpoint = checkpoint
        self.reason = reason


class _StopSignals:
    """Turns SIGINT / SIGTERM into a flag checked at optimizer-step boundaries; a second signal acts at once."""

    def __init__(self):
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: signals cannot be caught here
                pass
        return self

    def _handle(self, signum, frame):
        if self.received is not None:
            previous = self._previous.get(signum)
            if callable(previous):
                previous(signum, frame)
            raise KeyboardInterrupt
        self.received = signum
        logger.warning(f"Received {signal.Signals(signum).name}: checkpointing after the current step, then stopping.")

    def __exit__(self, *exc):
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        return False


def _load_backbone(backbone_or_path, tokenizer, config: MRPTrainingConfig):
    """(model, base model id, tokenizer, mask id found beside the weights)."""
    found_mask = None
    if isinstance(backbone_or_path, (str, os.PathLike)):
        path = str(backbone_or_path)
        model, found_mask = load_backbone(
            path,
            backbone_family=config.backbone_family,
            trust_remote_code=config.trust_remote_code,
            revision=config.revision,
            torch_dtype=resolve_dtype(config.backbone_dtype),
            device_map=config.backbone_device_map,
            return_mask_token_id=True,
        )
        base_id = path
        if tokenizer is None:
            from transformers import AutoTokenizer

            try:
                tokenizer = AutoTokenizer.from_pretrained(path, revision=config.revision, trust_remote_code=config.trust_remote_code)
            except Exception as err:  # pre-tokenized data needs none
                logger.info(f"No tokenizer loaded from {path!r} ({type(err).__name__}); only pre-tokenized records will work.")
    else:
        model = backbone_or_path
        base_id = getattr(getattr(model, "config", None), "_name_or_path", None) or None
    if isinstance(tokenizer, (str, os.PathLike)):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer), trust_remote_code=config.trust_remote_code)
    return model, base_id, tokenizer, found_mask


def row_builder(adapter, grid: int | None, max_length: int, pad_id: int, packing: bool = False) -> RowBuilder:
    """Rows laid out as the decoding engine lays out its canvas: blocks of `grid` counted from each sample's
    first token ("sequence" families) or from its response start (the reference DLM); no pads for families
    whose attention cannot mask them."""
    align = grid if (grid is not None and adapter.supports_padding) else 1
    alignment = adapter.block_alignment if adapter.block_causal else "answer"
    return RowBuilder(max_length, pad_id, align=align, packing=packing, alignment=alignment)


def _input_vocab_size(adapter) -> int:
    """Ids the backbone accepts: its lm_head's vocabulary, or fewer if its input embedding has fewer rows."""
    size = adapter.vocab_size
    embedding = getattr(adapter.get_input_embeddings(), "weight", None)
    return min(size, int(embedding.shape[0])) if embedding is not None else size


def _token_id(*candidates) -> int | None:
    for value in candidates:
        if isinstance(value, (list, tuple)) and value:
            value = value[0]
        if isinstance(value, int) and value >= 0:
            return value
    return None


def _split_samples(record_set, eval_record_set, to_ids, vocab_size: int, config: MRPTrainingConfig):
    """(train records, train samples, held-out samples, held-out description): a separate held-out set, or
    `eval_fraction` of the data (a fixed function of the seed)."""
    samples = tokenize_records(record_set, to_ids, vocab_size)
    if eval_record_set is not None:
        return record_set.records, samples, tokenize_records(eval_record_set, to_ids, vocab_size), eval_record_set.description
    train_index, eval_index = split_records(list(range(len(samples))), config.eval_fraction, config.seed, config.eval_max_samples)
    eval_samples = [samples[i] for i in eval_index]
    eval_source = f"{len(eval_samples)} held out from {record_set.description}" if eval_samples else None
    return [record_set.records[i] for i in train_index], [samples[i] for i in train_index], eval_samples, eval_source


def cosine_schedule(optimizer, config: MRPTrainingConfig, total_steps: int, steps_per_optimizer_step: int = 1):
    """transformers' cosine decay to `lr * min_lr_ratio` after a linear warm-up (`warmup_steps`, default
    `warmup_ratio` of the run). `steps_per_optimizer_step`: how often the scheduler steps per optimizer step
    (accelerate steps a prepared scheduler once per process unless it splits batches), so that the schedule
    follows optimizer steps whatever the number of processes."""
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    warmup = config.warmup_steps if config.warmup_steps is not None else int(config.warmup_ratio * total_steps)
    return get_cosine_with_min_lr_schedule_with_warmup(
        optimizer,
        num_warmup_steps=warmup * steps_per_optimizer_step,
        num_training_steps=total_steps * steps_per_optimizer_step,
        min_lr_rate=config.min_lr_ratio,
    )


class Trainer:
    """One run of head training, in the steps of the module docstring: `train()` runs it and returns the head.

    Built and run by `train_head`; each step is one method (`setup_*`, `resume`, `train_step`, `evaluate`,
    `checkpoint`, `save`). The progress of the run (`global_step`, `epoch`, `batches_done`, `history`,
    `last_logs`) lives on the object and is what a checkpoint stores besides the states.
    """

    def __init__(self, backbone_or_path: Any, dataset: Any, output_dir: str | os.PathLike, *, tokenizer: Any = None,
                 config: MRPTrainingConfig | None = None, eval_dataset: Any = None,
                 on_step_end: Callable[[int, dict[str, Any]], None] | None = None,
                 head_config_overrides: dict[str, Any] | None = None):
        from accelerate import Accelerator

        self.config = config = config or MRPTrainingConfig()
        self.backbone_or_path, self.dataset, self.tokenizer = backbone_or_path, dataset, tokenizer
        self.eval_dataset = eval_dataset if eval_dataset is not None else (config.eval_dataset or None)
        self.output_dir = Path(output_dir)
        self.on_step_end = on_step_end
        self.head_config_overrides = dict(head_config_overrides or {})
        self.accelerator = Accelerator(mixed_precision=config.mixed_precision, gradient_accumulation_steps=config.grad_accum)
        self.fsdp = fsdp_version(self.accelerator)
        self.global_step = self.epoch = self.batches_done = self.run_steps = 0
        self.history: list[dict[str, Any]] = []
        self.last_logs: dict[str, Any] = {}

    # ------------------------------------------------------------------ the run
    def train(self) -> MRPHead:
        """Steps 1-6; raises `TrainingInterrupted` after checkpointing on a signal or `stop_after`."""
        from accelerate.utils import set_seed

        config = self.config
        _check_distributed(self.accelerator, config, self.fsdp)
        # the output folder: never start over a checkpoint or a trained head unless told to; a finished run is done
        _check_output_is_not_backbone(self.backbone_or_path, self.output_dir)
        output_state = prepare_output_dir(self.output_dir, resume=config.resume, overwrite=config.overwrite)
        if config.resume and output_state.finished:
            return _finished_head(self.accelerator, self.output_dir, output_state.head_steps, config)
        # every record is read and checked (file and line of each bad one) before the backbone is loaded
        record_set = read_records(self.dataset)
        eval_record_set = read_records(self.eval_dataset) if self.eval_dataset is not None else None
        set_seed(config.seed)
        self.setup_backbone()
        self.setup_data(record_set, eval_record_set)
        self.setup_head()
        self.setup_optimization()
        self.resume()
        if config.overwrite:  # only now that data, backbone and head are ready: a run that fails before deletes nothing
            clear_output_dir(self.output_dir, self.accelerator)
        stop_reason = self.train_loop()
        if stop_reason is not None:
            raise TrainingInterrupted(self.global_step, str(self.output_dir / CHECKPOINT), stop_reason)
        if self.run_steps:
            # the last steps survive a crash or a full disk during the final evaluation and save: resume writes the head
            self.checkpoint()
        return self.save()

    # ------------------------------------------------------------------ 1-3. set-up
    def setup_backbone(self) -> None:
        """The frozen backbone (eval mode, on this process's device unless FSDP shards it), its adapter, the
        block length and the attention grid."""
        config, accelerator = self.config, self.accelerator
        model, self.base_id, self.tokenizer, found_mask = _load_backbone(self.backbone_or_path, self.tokenizer, config)
        mask_id = _token_id(config.mask_token_id, getattr(self.tokenizer, "mask_token_id", None), found_mask)
        adapter = get_adapter(model, backbone_family=config.backbone_family, mask_token_id=mask_id)
        if not 0 <= adapter.mask_token_id < adapter.vocab_size:
            raise ValueError(
                f"mask token id {adapter.mask_token_id} is outside the backbone's vocabulary ({adapter.vocab_size}); "
                f"pass mask_token_id=<the tokenizer's mask id>."
            )
        model.eval()
        model.requires_grad_(False)
        self.shard = bool(self.fsdp and config.shard_backbone and accelerator.num_processes > 1)
        if config.backbone_device_map is not None:
            if accelerator.num_processes > 1:
                raise ValueError("backbone_device_map splits the backbone inside one process; do not combine it with several processes.")
        elif not self.shard:  # under FSDP the backbone's layers are sharded once the head exists (setup_head)
            model.to(accelerator.device)
        self.model, self.adapter = model, adapter
        self.block_length = adapter.resolve_block_length(config.block_length)
        self.grid = (adapter.block_size or self.block_length) if adapter.block_causal else None

    def setup_data(self, record_set, eval_record_set) -> None:
        """Records -> samples (ids checked against the vocabulary) -> rows (padding or packing), the held-out
        rows, the training data loader (prepared: sharded over the processes)."""
        config, adapter = self.config, self.adapter
        backbone_config = getattr(self.model, "config", None)
        eos_id = _token_id(getattr(self.tokenizer, "eos_token_id", None), getattr(backbone_config, "eos_token_id", None))
        pad_id = _token_id(getattr(self.tokenizer, "pad_token_id", None), eos_id, getattr(backbone_config, "pad_token_id", None), 0)
        to_ids = RecordTokenizer(self.tokenizer, append_eos=config.append_eos, chat_template=config.chat_template, eos_token_id=eos_id)
        train_records, train_samples, eval_samples, eval_source = _split_samples(
            record_set, eval_record_set, to_ids, _input_vocab_size(adapter), config
        )
        builder = row_builder(adapter, self.grid, config.max_length, pad_id, packing=config.packing)
        train_rows, dropped = builder.build(train_samples)
        self.eval_rows, _ = builder.build(eval_samples)
        if dropped:
            logger.warning(f"{dropped} samples had no response token left after truncation to {config.max_length} and were dropped.")
        if not train_rows:
            raise ValueError(f"No training rows from {record_set.description}: every sample was empty or dropped.")
        self.collator = RowCollator(pad_id, self.block_length, absolute_blocks=adapter.block_causal,
                                    pad_to=config.max_length if config.packing else None)
        self.sampler = EpochSampler(len(train_rows), config.seed)
        loader = DataLoader(RowDataset(train_rows), batch_size=config.batch_size, sampler=self.sampler,
                            collate_fn=self.collator, num_workers=config.num_workers)
        self.train_loader = self.accelerator.prepare(loader)
        self.data_info = {
            "source": record_set.description, "format": _record_format(train_records), "train": describe_rows(train_rows),
            "eval": describe_rows(self.eval_rows) if self.eval_rows else None, "eval_source": eval_source,
            "max_length": config.max_length, "packing": config.packing,
        }

    def setup_head(self) -> None:
        """The head (`MRPConfig.for_backbone`, seeded) in its `HeadChain`; under FSDP, the backbone's layers sharded."""
        from accelerate.utils import set_seed

        config = self.config
        overrides = dict(self.head_config_overrides)
        for name in ("num_hidden_layers", "head_hidden_size", "num_attention_heads"):
            if getattr(config, name) is not None:
                overrides.setdefault(name, getattr(config, name))
        overrides.setdefault("block_length", self.block_length)
        if config.revision is not None:
            overrides.setdefault("base_model_revision", config.revision)
        overrides.setdefault("base_model_name_or_path", self.base_id)  # a caller may name the base model (a Hub id)
        head_config = MRPConfig.for_backbone(self.adapter, **overrides)
        set_seed(config.seed)
        self.head = MRPHead(head_config)
        self.chain = HeadChain(self.head)
        self.sharded_layers = self._shard_backbone() if self.fsdp else 0

    def _shard_backbone(self) -> int:
        # a layer class named in the FSDP config that the head lacks is the backbone's: shard those layers
        backbone_classes = split_wrap_classes(self.accelerator.state.fsdp_plugin, self.chain)
        if not self.shard:
            return 0
        sharded_layers = shard_backbone(self.model, self.accelerator, backbone_classes)
        if not sharded_layers:
            logger.warning(
                "FSDP: no transformer layer class to shard in the backbone (it has no `_no_split_modules` and "
                "`fsdp_transformer_layer_cls_to_wrap` names none of its classes): it is replicated on every process."
            )
            self.model.to(self.accelerator.device)
        return sharded_layers

    def setup_optimization(self) -> None:
        """The objective, AdamW (no decay on biases and norms), the cosine schedule; `prepare`; the noise generator."""
        config, accelerator = self.config, self.accelerator
        self.objective = MRPObjective.from_config(self.adapter, config, block_length=self.block_length, grid=self.grid)
        decay = [p for n, p in self.head.named_parameters() if p.ndim >= 2]
        no_decay = [p for n, p in self.head.named_parameters() if p.ndim < 2]
        optimizer = _adamw(
            [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=config.lr, betas=config.adam_betas, eps=config.adam_eps,
        )
        self.steps_per_epoch = max(1, math.ceil(len(self.train_loader) / config.grad_accum))
        self.total_steps = config.max_steps or max(1, math.ceil(config.epochs * self.steps_per_epoch))
        scheduler_steps = 1 if getattr(accelerator, "split_batches", False) else accelerator.num_processes
        scheduler = cosine_schedule(optimizer, config, self.total_steps, scheduler_steps)
        self.chain, self.optimizer, self.scheduler = accelerator.prepare(self.chain, optimizer, scheduler)
        self.data_generator = torch.Generator().manual_seed(config.seed * 1_000_003 + 7919 * accelerator.process_index + 1)

    # ------------------------------------------------------------------ 4. resume
    def resume(self) -> None:
        """With `resume`: weights, optimizer, schedule, RNG states and the data position from the checkpoint."""
        if not self.config.resume:
            return
        found = find_checkpoint(self.output_dir)
        if found is None:
            logger.warning(f"resume=True but {self.output_dir} holds no checkpoint: starting from scratch.")
            return
        full_loaders = None
        if self.fsdp:
            accelerator, chain = self.accelerator, self.chain
            full_loaders = (lambda weights: load_full_model_state(accelerator, chain, weights, prefix="head."),
                            lambda state: load_full_optimizer_state(accelerator, chain, self.optimizer, state))
        state = load_checkpoint(found, self.accelerator, self.data_generator, state_format=self.state_format,
                                load_full_states=full_loaders, scheduler=self.scheduler)
        _check_resume_config(state.get("config", {}), self.config)
        self.global_step, self.epoch, self.batches_done = state["global_step"], state["epoch"], state["batches_in_epoch"]
        self.history = state.get("history", [])
        self.last_logs = state.get("last_logs", {})
        logger.info(f"Resumed from {found} at step {self.global_step} (epoch {self.epoch}, batch {self.batches_done}).")

    @property
    def state_format(self) -> str:
        return "fsdp" if self.fsdp else "plain"

    # ------------------------------------------------------------------ 5. the loop
    def train_loop(self) -> str | None:
        """Epochs until `total_steps` optimizer steps; returns why it stopped early (a signal, `stop_after`) or None."""
        config = self.config
        self.progress = tqdm(
            total=self.total_steps, initial=self.global_step, desc="mrp train", dynamic_ncols=True,
            disable=config.disable_progress or not self.accelerator.is_local_main_process,
        )
        self.start_time = time.perf_counter()
        stop_reason: str | None = None
        with _StopSignals() as signals:
            while self.global_step < self.total_steps and stop_reason is None:
                stop_reason = self.train_epoch(signals)
        self.progress.close()
        return stop_reason

    def train_epoch(self, signals: _StopSignals) -> str | None:
        """The rest of the current epoch (from `batches_done`), up to the last step or an early stop."""
        skip = self.batches_done
        loader = self.accelerator.skip_first_batches(self.train_loader, skip) if skip else self.train_loader
        loader.set_epoch(self.epoch)  # accelerate passes it on to our sampler: the epoch fixes the data order
        self.sampler.set_epoch(self.epoch)
        self.chain.train()
        window_loss, window_count = None, 0
        stop_reason, left_early = None, False
        for batch in loader:
            loss = self.train_step(batch)
            self.batches_done += 1
            window_loss = loss if window_loss is None else window_loss + loss  # no host sync per micro-batch
            window_count += 1
            if not self.accelerator.sync_gradients:
                continue
            self.after_optimizer_step(float(window_loss) / window_count)
            window_loss, window_count = None, 0
            if self.global_step < self.total_steps:  # after the last step the final evaluation and save follow
                stop_reason = self.between_steps(signals)
            if self.global_step >= self.total_steps or stop_reason is not None:
                left_early = True
                break
        if not left_early:
            self.epoch += 1
            self.batches_done = 0
        if hasattr(loader, "end"):  # leaving a loader early: tell accelerate it is no longer iterated
            loader.end()
        return stop_reason

    def train_step(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """One micro-batch: prepare the targets (K + 1 frozen backbone forwards), the head's loss, backward, and
        at the end of an accumulation window clip and step. Returns the detached loss."""
        accelerator, config = self.accelerator, self.config
        with accelerator.accumulate(self.chain):
            with accelerator.autocast():
                prepared = self.objective.prepare(batch, self.data_generator)
                loss = self.objective.loss(self.chain, prepared)
            accelerator.backward(loss)
            if accelerator.sync_gradients and config.max_grad_norm:
                accelerator.clip_grad_norm_(self.chain.parameters(), config.max_grad_norm)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad()
        return loss.detach()

    def after_optimizer_step(self, loss: float) -> None:
        """Count the step, log it, call `on_step_end`."""
        self.global_step += 1
        self.run_steps += 1
        self.last_logs = {"loss": loss, "lr": self.scheduler.get_last_lr()[0]}
        self.progress.update(1)
        if self.global_step % max(1, self.config.logging_every) == 0 or self.global_step == self.total_steps:
            self.progress.set_postfix(loss=f"{loss:.4f}", lr=f"{self.last_logs['lr']:.2e}")
        if self.on_step_end is not None:
            self.on_step_end(self.global_step, dict(self.last_logs))

    def between_steps(self, signals: _StopSignals) -> str | None:
        """Held-out evaluation and checkpoint when due; returns why to stop now (SIGINT / SIGTERM on any process,
        or `stop_after`; checkpointed first) or None."""
        config = self.config
        if config.eval_every and self.global_step % config.eval_every == 0:
            self.evaluate()
            self.chain.train()
        stop_reason = None
        if _any_process(self.accelerator, signals.received is not None):
            stop_reason = signal.Signals(signals.received or signal.SIGTERM).name
        elif config.stop_after is not None and self.run_steps >= config.stop_after:
            stop_reason = f"stop_after={config.stop_after}"
        if stop_reason is not None or (config.save_every and self.global_step % config.save_every == 0):
            self.checkpoint()
        return stop_reason

    # ------------------------------------------------------------------ evaluation, checkpoints, the result
    def evaluate(self) -> dict[str, Any] | None:
        """Held-out metrics (fixed noise), appended to `history` and logged; None without held-out rows."""
        if not self.eval_rows:
            return None
        metrics = _evaluate(self.accelerator, self.chain, self.objective, self.eval_rows, self.collator, self.config,
                            lockstep=bool(self.fsdp))
        metrics["step"] = self.global_step
        self.history.append(metrics)
        if self.accelerator.is_main_process:
            logger.info(
                f"step {self.global_step}: held-out agreement {metrics['agreement']:.4f} "
                f"(C=0: {metrics['baseline_agreement']:.4f}), KL {metrics['kl']:.4f} (C=0: {metrics['baseline_kl']:.4f})"
            )
        return metrics

    def trainer_state(self) -> dict[str, Any]:
        return {
            "global_step": self.global_step, "epoch": self.epoch, "batches_in_epoch": self.batches_done,
            "total_steps": self.total_steps, "num_processes": self.accelerator.num_processes,
            "state_format": self.state_format, "config": self.config.to_dict(), "history": self.history,
            "last_logs": self.last_logs,
        }

    def checkpoint(self) -> Path:
        """An atomic checkpoint (collective: every process calls it)."""
        accelerator, full_states, needed = self.accelerator, None, 0
        if self.fsdp:  # gathering the full states is collective
            full_states = (full_model_state(accelerator, self.chain, prefix="head."),
                           full_optimizer_state(accelerator, self.chain, self.optimizer))
            needed = state_nbytes(full_states)
        elif accelerator.is_main_process:
            needed = state_nbytes(self.chain.state_dict()) + state_nbytes(self.optimizer.state_dict())
        return save_checkpoint(accelerator, self.output_dir, self.data_generator, self.trainer_state(), needed,
                               full_states=full_states, scheduler=self.scheduler)

    def training_info(self, final: dict[str, Any] | None) -> dict[str, Any]:
        """What the head's config records about its training (`config.training`)."""
        config, accelerator = self.config, self.accelerator
        return {
            "objective": config.objective, "k_steps": config.k_steps, "reveal_per_block": config.reveal_per_block,
            "reveal_max": config.reveal_max, "reveal_order": config.reveal_order, "mask_eps": config.mask_eps,
            "block_length": self.block_length, "attention_grid": self.grid, "steps": self.global_step,
            "epochs": round(self.global_step / self.steps_per_epoch, 4), "batch_size": config.batch_size,
            "grad_accum": config.grad_accum, "num_processes": accelerator.num_processes,
            "global_batch_size": config.batch_size * config.grad_accum * accelerator.num_processes,
            "distributed": _describe_distributed(accelerator, self.fsdp, self.sharded_layers),
            "lr": config.lr, "seed": config.seed, "mixed_precision": config.mixed_precision, "data": self.data_info,
            "final_train_loss": self.last_logs.get("loss"), "metrics": final,
        }

    def save(self) -> MRPHead:
        """Final held-out evaluation; the head (`save_pretrained`) with the metrics in its config and in
        `training_metrics.json`, written atomically; the checkpoint removed (unless `keep_checkpoint`)."""
        accelerator, head = self.accelerator, self.head
        final = self.evaluate()
        seconds = time.perf_counter() - self.start_time
        head.config.training = self.training_info(final)
        weights = None
        if self.fsdp:  # the prepared head is sharded: gather its full weights (collective) into a plain head
            weights = full_model_state(accelerator, self.chain, prefix="head.")
            head = MRPHead(head.config)
            if weights:
                head.load_state_dict(weights)
        if accelerator.is_main_process:
            metrics_text = json.dumps({"final": final, "history": self.history, "train_loss": self.last_logs.get("loss"),
                                       "seconds_this_run": round(seconds, 2)}, indent=2) + "\n"

            def write_head(folder: Path) -> None:
                head.save_pretrained(str(folder))
                (folder / "training_metrics.json").write_text(metrics_text)

            # into a temporary folder, then moved in with config.json last: a half-written head never looks finished
            save_final(self.output_dir, write_head, needed_bytes=state_nbytes(head.state_dict()) + 1024 * 1024)
            if not self.config.keep_checkpoint:
                remove_checkpoints(self.output_dir)
        accelerator.wait_for_everyone()
        if self.fsdp and not weights:  # this process got no gathered copy: read the saved head
            head.load_state_dict(MRPHead.from_pretrained(str(self.output_dir)).state_dict())
        return head.to("cpu").eval()


def train_head(
    backbone_or_path: Any,
    dataset: Any,
    output_dir: str | os.PathLike,
    *,
    tokenizer: Any = None,
    config: MRPTrainingConfig | None = None,
    eval_dataset: Any = None,
    on_step_end: Callable[[int, dict[str, Any]], None] | None = None,
    **head_config_overrides: Any,
) -> MRPHead:
    """Train an MRP head for a frozen DLM backbone and save it (head only) to `output_dir`.

    Args:
        backbone_or_path: a loaded backbone (`PreTrainedModel`) or its Hub id / local folder.
        dataset: JSONL path, local `datasets` folder, list of records or `datasets.Dataset` (see
            `mrp_hf.training.data`).
        output_dir: where the head (`config.json`, `model.safetensors`, `training_metrics.json`) and, while
            training, the resumable `checkpoint/` go.
        tokenizer: the backbone's tokenizer (object or path); loaded from `backbone_or_path` when it is a path.
        config: an `MRPTrainingConfig` (defaults otherwise).
        eval_dataset: held-out records (same forms as `dataset`); overrides `config.eval_dataset` and
            `config.eval_fraction`.
        on_step_end: called on every process after each optimizer step with (step, logs).
        **head_config_overrides: extra `MRPConfig` fields (e.g. `intermediate_size=...`).

    Returns the trained `MRPHead` (on the CPU, eval mode). Raises `TrainingInterrupted` after checkpointing
    when stopped by SIGINT / SIGTERM or `config.stop_after`; rerun with `resume=True` to continue.
    """
    trainer = Trainer(backbone_or_path, dataset, output_dir, tokenizer=tokenizer, config=config,
                      eval_dataset=eval_dataset, on_step_end=on_step_end, head_config_overrides=head_config_overrides)
    return trainer.train()


def _check_output_is_not_backbone(backbone_or_path: Any, output_dir: Path) -> None:
    if isinstance(backbone_or_path, (str, os.PathLike)) and Path(backbone_or_path).is_dir():
        if Path(backbone_or_path).resolve() == output_dir.resolve():
            raise ValueError(
                f"The output folder {output_dir} is the backbone's own folder: the head's config.json and "
                f"model.safetensors would replace the backbone's. Choose another output folder."
            )


def _finished_head(accelerator, output_dir: Path, steps: int | None, config: MRPTrainingConfig) -> MRPHead:
    """`resume=True` on a finished run: nothing to train; the saved head."""
    if accelerator.is_main_process:
        longer = ""
        if config.max_steps is not None and steps is not None and config.max_steps > steps:
            longer = (f" It was trained for {steps} steps and max_steps={config.max_steps} asks for more: a longer "
                      f"run starts over with --overwrite (overwrite=True).")
        logger.warning(f"{output_dir} holds a finished run (its trained head, step {steps}): nothing to resume.{longer}")
    return MRPHead.from_pretrained(str(output_dir)).to("cpu").eval()


def _check_distributed(accelerator, config: MRPTrainingConfig, fsdp: int | None) -> None:
    kind = accelerator.distributed_type.name
    if kind == "DEEPSPEED":
        raise NotImplementedError(
            "DeepSpeed is not supported for head training (untested: ZeRO partitions the head's optimizer state per "
            "process, which these checkpoints do not gather, and it would not shard the frozen backbone). Use an "
            "`accelerate` FSDP config (FULL_SHARD shards the head like ZeRO-3 and also shards the backbone's layers) "
            "or DDP; see docs/training.md."
        )
    if kind == "MEGATRON_LM":
        raise NotImplementedError("Megatron-LM is not supported for head training; use FSDP or DDP (docs/training.md).")
    launched = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if launched > 1 and accelerator.num_processes == 1:
        raise RuntimeError(
            f"{launched} processes were launched but accelerate set up a single-process run in each (no GPU, and "
            f"ACCELERATE_USE_CPU is not set: `accelerate launch --cpu` does not set it for FSDP configs): they would "
            f"train independently and overwrite each other's output. On CPU, set ACCELERATE_USE_CPU=true."
        )
    if fsdp is None and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and accelerator.num_processes > 1:
        logger.warning(
            f"The accelerate config asks for FSDP but accelerate runs it as {kind} here (accelerate enables FSDP on "
            f"GPUs/accelerators only, not with --cpu): head and backbone are replicated on every process."
        )
    if fsdp:
        plugin = accelerator.state.fsdp_plugin
        if getattr(plugin, "cpu_ram_efficient_loading", False):
            raise ValueError(
                "fsdp_cpu_ram_efficient_loading=true makes transformers load the backbone's weights on the first "
                "process only and expects the trained model's FSDP wrapper to broadcast them; the frozen backbone is "
                "not that model, so the other processes would keep uninitialised weights. Set it to false."
            )
        if config.backbone_device_map is not None:
            raise ValueError("backbone_device_map cannot be combined with FSDP; FSDP shards the backbone's layers itself.")


def _describe_distributed(accelerator, fsdp: int | None, sharded_layers: int) -> dict[str, Any]:
    out: dict[str, Any] = {"type": accelerator.distributed_type.name, "num_processes": accelerator.num_processes}
    if fsdp:
        out["fsdp_version"] = fsdp
        out["backbone_sharded_layers"] = sharded_layers
    return out


def _adamw(groups, **kwargs) -> torch.optim.AdamW:
    """AdamW, fused (one kernel for all parameters) where this torch supports it for these parameters."""
    try:
        return torch.optim.AdamW(groups, fused=True, **kwargs)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(groups, **kwargs)


def _any_process(accelerator, flag: bool) -> bool:
    if accelerator.num_processes == 1:
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
    return bool(accelerator.reduce(value, reduction="sum").item() > 0)


@torch.no_grad()
def _evaluate(
    accelerator, chain, objective: MRPObjective, rows, collator, config: MRPTrainingConfig, lockstep: bool = False
) -> dict[str, Any]:
    """Held-out metrics with a fixed noise seed (the same masks and reveals at every evaluation).

    With `lockstep` (FSDP: every forward of a sharded module is a collective), every process runs the same
    number of batches: a process whose share of the rows is shorter repeats its first batch and drops the result.
    """
    # DDP: the unwrapped module (no gradient sync); FSDP: the wrapped one, which gathers its sharded weights
    model = chain if lockstep else accelerator.unwrap_model(chain)
    was_training = model.training
    model.eval()
    meter = AgreementMeter(objective.k_steps)
    shard = rows[accelerator.process_index :: accelerator.num_processes]
    generator = torch.Generator().manual_seed(config.seed * 7 + 104_729 + accelerator.process_index)
    size = config.eval_batch_size or config.batch_size
    batches = math.ceil(len(shard) / size)
    if lockstep:
        batches = math.ceil(math.ceil(len(rows) / accelerator.num_processes) / size)  # the first process's count
    for b in range(batches):
        part = shard[b * size : (b + 1) * size]
        padding = not part
        batch = {k: v.to(accelerator.device) for k, v in collator(part or (shard or rows)[:size]).items()}
        with accelerator.autocast():
            prepared = objective.prepare(batch, torch.Generator().manual_seed(0) if padding else generator, keep_base_logits=True)
            logits = objective.step_logits(model, prepared)
        if not padding:
            meter.update(objective, logits, prepared)
    sums = meter.sums
    if accelerator.num_processes > 1:
        sums = accelerator.reduce(sums.to(accelerator.device), reduction="sum").cpu()
    model.train(was_training)
    return meter.result(sums)


def _record_format(records: list[dict[str, Any]]) -> str:
    if not records:
        return "empty"
    keys = set(records[0])
    if "messages" in keys:
        return "messages"
    if "prompt_ids" in keys:
        return "token ids"
    return "prompt/response"


def _check_resume_config(saved: dict[str, Any], config: MRPTrainingConfig) -> None:
    current = config.to_dict()
    changed = [
        f"{name}: {saved[name]!r} -> {current[name]!r}"
        for name in MRPTrainingConfig.RESUME_FIELDS
        if name in saved and saved[name] != current[name]
    ]
    if changed:
        logger.warning("Resuming with a different training config; the run will not match an uninterrupted one: " + "; ".join(changed))
