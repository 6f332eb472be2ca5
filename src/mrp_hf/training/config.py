"""`MRPTrainingConfig`: every knob of head training, validated with errors that name the fix."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

Objective = Literal["kl", "ce"]
RevealOrder = Literal["confidence", "random"]
MixedPrecision = Literal["no", "bf16", "fp16"]
BackboneDtype = Literal["auto", "float32", "bfloat16", "float16"]
OBJECTIVES, REVEAL_ORDERS = get_args(Objective), get_args(RevealOrder)
MIXED_PRECISION, BACKBONE_DTYPES = get_args(MixedPrecision), get_args(BackboneDtype)


def _option(default: Any, help: str, *aliases: str) -> Any:
    """A field with its `mrp-hf train` help text and other flag names (read by `HfArgumentParser`)."""
    metadata: dict[str, Any] = {"help": help}
    if aliases:
        metadata["aliases"] = list(aliases)
    return field(default=default, metadata=metadata)


@dataclass
class MRPTrainingConfig:
    """How an MRP head is trained (a `TrainingArguments`-like dataclass; `mrp-hf train` flags map onto it).

    Data:
        max_length: tokens per row (prompt + response, truncated: the response's end first, the prompt's
            start when the prompt alone is too long).
        packing: concatenate samples into rows of `max_length` (no pads, the samples of a row see each other)
            instead of one right-padded sample per row.
        append_eos: end every response with the tokenizer's EOS (as the sampler must learn to write it).
        chat_template: wrap `{"prompt","response"}` rows in the tokenizer's chat template
            (`{"messages": [...]}` rows always are).
        eval_fraction / eval_dataset: the held-out split (a fraction of the data, or a separate file/folder).
        eval_max_samples: cap on the held-out samples taken from `eval_fraction`.

    Objective (MRP_METHOD.md section 4):
        objective: `"kl"` (KL(softmax(T) || softmax(A + C)) on positions still masked after the reveals) or
            `"ce"` (cross-entropy of A + C against the ground truth on the same positions).
        mask_eps: t ~ U(mask_eps, 1) per sample; each response token is masked with probability t.
        block_length: reveal blocks (default: the model's attention block, the family's decoding default, or 32).
        reveal_per_block: ground-truth reveals per block per step: an int, or `"random"` (drawn per sample
            and step from {1..reveal_max}).
        reveal_order: `"confidence"` (the backbone's most confident masked positions first, as the static
            sampler reveals) or `"random"`.
        k_steps: chained head steps on the accumulator (K + 1 backbone forwards per batch), each weighted 1/K.

    Optimisation: AdamW (`lr`, `weight_decay`, `adam_betas`, `adam_eps`), cosine decay to
    `lr * min_lr_ratio` after `warmup_steps` (default: `warmup_ratio` of the run), gradient clipping at
    `max_grad_norm`; `batch_size` rows per process per micro-batch, `grad_accum` micro-batches per step;
    `max_steps` (optimizer steps) wins over `epochs`.

    Run: `eval_every`, `save_every` (optimizer steps; 0 = never, except at the end / on a signal),
    `resume` (continue from `output_dir/checkpoint`; on a finished run: return its head, train nothing),
    `overwrite` (delete the output folder's checkpoint and trained head and start over; without it, or
    `resume`, a run refuses an output folder that holds either), `stop_after` (stop after this many
    optimizer steps of this run, checkpoint, and return: a preemption budget), `seed`, `mixed_precision`,
    `disable_progress`, `logging_every`.

    Backbone (when given by id/path): `trust_remote_code`, `revision`, `backbone_family`, `mask_token_id`,
    `backbone_dtype`, `backbone_device_map` (single process only), `shard_backbone` (under an `accelerate`
    FSDP config, shard the frozen backbone's transformer layers over the processes; False keeps a full
    copy on every process: more memory, no all-gathers).

    Head: `num_hidden_layers`, `head_hidden_size`, `num_attention_heads` (default: the backbone's);
    other `MRPConfig` fields go to `train_head(**head_config_overrides)`.
    """

    #: `HfArgumentParser` puts the fields under this heading in `mrp-hf train --help`
    _argument_group_name = "training (MRPTrainingConfig)"

    # data
    max_length: int = _option(1024, "tokens per row (prompt + response, truncated)")
    packing: bool = _option(False, "pack samples into rows of --max-length instead of one padded sample per row")
    append_eos: bool = _option(True, "end every response with the tokenizer's EOS (--no-eos: do not)")
    chat_template: bool = _option(False, "wrap {prompt,response} rows in the tokenizer's chat template")
    eval_fraction: float = _option(0.05, "held-out fraction of --dataset")
    eval_dataset: str | None = _option(None, "held-out data (same formats as --dataset); None: --eval-fraction of --dataset", "--eval-file")
    eval_max_samples: int = _option(1000, "cap on the held-out samples taken by --eval-fraction")
    # objective
    objective: Objective = _option("kl", "kl: KL(T || A + C) on positions still masked; ce: cross-entropy against the data")
    mask_eps: float = _option(1e-3, "t ~ U(mask_eps, 1) per sample; each response token is masked with probability t")
    block_length: int | None = _option(None, "reveal block; None: the model's block, the family's default, or 32")
    reveal_per_block: int | str = _option("random", "reveals per block per step: an int or 'random' (1..--reveal-max)")
    reveal_max: int = _option(4, "largest random reveal count")
    reveal_order: RevealOrder = _option("confidence", "reveal the backbone's most confident masked positions first, or random ones")
    k_steps: int = _option(1, "chained head steps (K + 1 backbone forwards per batch)")
    # optimisation
    batch_size: int = _option(8, "rows per process per micro-batch")
    eval_batch_size: int | None = _option(None, "held-out rows per batch; None: --batch-size")
    grad_accum: int = _option(1, "micro-batches per optimizer step")
    lr: float = _option(1e-3, "peak learning rate (AdamW)")
    weight_decay: float = _option(0.0, "AdamW weight decay (not on biases and norms)")
    adam_betas: tuple[float, float] = _option((0.9, 0.999), "AdamW betas (two numbers)")
    adam_eps: float = _option(1e-8, "AdamW epsilon")
    warmup_steps: int | None = _option(None, "linear warm-up steps; None: --warmup-ratio of the run")
    warmup_ratio: float = _option(0.03, "warm-up as a fraction of the run's steps")
    min_lr_ratio: float = _option(0.0, "the cosine decays to lr * min_lr_ratio")
    max_grad_norm: float = _option(1.0, "gradient clipping (0: none)")
    max_steps: int | None = _option(None, "optimizer steps (wins over --epochs)", "--steps")
    epochs: float = _option(1.0, "passes over the training rows (when --steps is not given)")
    # run
    eval_every: int = _option(500, "held-out evaluation every N optimizer steps (0: only at the end)")
    save_every: int = _option(500, "checkpoint every N optimizer steps (0: only at the end and on a signal)")
    logging_every: int = _option(10, "progress-bar loss and lr every N steps")
    resume: bool = _option(False, "continue from OUTPUT/checkpoint (a finished run: say so and exit 0)")
    overwrite: bool = _option(False, "delete OUTPUT's checkpoint and trained head and start over (without --resume or "
                                     "--overwrite, an OUTPUT holding either is refused)")
    stop_after: int | None = _option(None, "checkpoint and stop after N steps of this run (a preemption budget)")
    keep_checkpoint: bool = _option(False, "keep OUTPUT/checkpoint after the run")
    seed: int = _option(0, "seed of the head's initialisation, the data order and the noise")
    mixed_precision: MixedPrecision = _option("no", "accelerate's mixed precision for the head")
    disable_progress: bool = _option(False, "no progress bar", "--no-progress")
    num_workers: int = _option(0, "data loader worker processes")
    # backbone
    trust_remote_code: bool = _option(False, "run the backbone's own modelling code from the Hub")
    revision: str | None = _option(None, "backbone revision (branch, tag or commit)")
    backbone_family: str | None = _option(None, "adapter family; None: detected from the config")
    mask_token_id: int | None = _option(None, "mask token id; None: the tokenizer's, else the config's")
    backbone_dtype: BackboneDtype = _option("auto", "dtype the frozen backbone is loaded in", "--dtype")
    backbone_device_map: Any = _option(  # a device map: "auto", "cuda:0", or a dict from Python
        None, 'e.g. "auto": split a large backbone over the GPUs (one process only)'
    )
    shard_backbone: bool = _option(True, "under an accelerate FSDP config, shard the backbone's layers "
                                         "(--no-shard-backbone: keep a full copy per process)")
    # head
    num_hidden_layers: int = _option(3, "head layers", "--num-layers")
    head_hidden_size: int | None = _option(None, "head hidden size; None: the backbone's")
    num_attention_heads: int | None = _option(None, "head attention heads; None: the backbone's", "--num-heads")

    def __post_init__(self) -> None:
        if isinstance(self.reveal_per_block, str) and self.reveal_per_block != "random":
            try:
                self.reveal_per_block = int(self.reveal_per_block)
            except ValueError:
                raise ValueError(
                    f"reveal_per_block={self.reveal_per_block!r}: give a positive int or 'random'."
                ) from None
        self.adam_betas = tuple(self.adam_betas)  # type: ignore[assignment]
        self.validate()

    def validate(self) -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        need(self.objective in OBJECTIVES, f"objective={self.objective!r}; choose one of {list(OBJECTIVES)}.")
        need(self.reveal_order in REVEAL_ORDERS, f"reveal_order={self.reveal_order!r}; choose one of {list(REVEAL_ORDERS)}.")
        need(
            self.mixed_precision in MIXED_PRECISION,
            f"mixed_precision={self.mixed_precision!r}; choose one of {list(MIXED_PRECISION)}.",
        )
        need(self.backbone_dtype in BACKBONE_DTYPES, f"backbone_dtype={self.backbone_dtype!r}; choose one of {list(BACKBONE_DTYPES)}.")
        need(
            self.reveal_per_block == "random" or (isinstance(self.reveal_per_block, int) and self.reveal_per_block >= 1),
            f"reveal_per_block={self.reveal_per_block!r}; give a positive int or 'random'.",
        )
        need(self.reveal_max >= 1, f"reveal_max={self.reveal_max}; it must be >= 1.")
        need(0.0 < self.mask_eps < 1.0, f"mask_eps={self.mask_eps}; it must lie in (0, 1), e.g. 1e-3.")
        need(self.k_steps >= 1, f"k_steps={self.k_steps}; it must be >= 1.")
        need(self.max_length >= 2, f"max_length={self.max_length} is too short for a prompt and a response.")
        need(self.block_length is None or self.block_length >= 1, f"block_length={self.block_length}; it must be >= 1.")
        need(self.batch_size >= 1 and self.grad_accum >= 1, "batch_size and grad_accum must be >= 1.")
        need(self.lr > 0, f"lr={self.lr}; it must be > 0.")
        need(self.max_steps is None or self.max_steps >= 1, f"max_steps={self.max_steps}; give a positive number or None.")
        need(self.max_steps is not None or self.epochs > 0, f"epochs={self.epochs}; give epochs > 0 or max_steps.")
        need(0.0 <= self.eval_fraction < 1.0, f"eval_fraction={self.eval_fraction}; it must lie in [0, 1).")
        need(
            not (self.resume and self.overwrite),
            "resume=True and overwrite=True contradict each other: resume continues the checkpoint, overwrite deletes "
            "it. Pass one of them.",
        )
        need(self.stop_after is None or self.stop_after >= 1, f"stop_after={self.stop_after}; give a positive number or None.")
        need(self.num_hidden_layers >= 1, f"num_hidden_layers={self.num_hidden_layers}; it must be >= 1.")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["adam_betas"] = list(self.adam_betas)
        if not isinstance(out["backbone_device_map"], (str, type(None))):
            out["backbone_device_map"] = str(out["backbone_device_map"])
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> MRPTrainingConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise TypeError(f"Unknown MRPTrainingConfig fields {sorted(unknown)}; known: {sorted(known)}.")
        return cls(**values)

    #: fields whose change makes a resumed run differ from an uninterrupted one
    RESUME_FIELDS = (
        "max_length", "packing", "append_eos", "chat_template", "eval_fraction", "objective", "mask_eps",
        "block_length", "reveal_per_block", "reveal_max", "reveal_order", "k_steps", "batch_size", "grad_accum",
        "lr", "weight_decay", "warmup_steps", "warmup_ratio", "min_lr_ratio", "max_grad_norm", "max_steps",
        "epochs", "seed", "num_hidden_layers", "head_hidden_size", "num_attention_heads",
    )
