"""`MRPTrainingConfig`: every knob of head training, validated with errors that name the fix."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

OBJECTIVES = ("kl", "ce")
REVEAL_ORDERS = ("confidence", "random")
MIXED_PRECISION = ("no", "bf16", "fp16")
BACKBONE_DTYPES = ("auto", "float32", "bfloat16", "float16")


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

    # data
    max_length: int = 1024
    packing: bool = False
    append_eos: bool = True
    chat_template: bool = False
    eval_fraction: float = 0.05
    eval_dataset: str | None = None
    eval_max_samples: int = 1000
    # objective
    objective: str = "kl"
    mask_eps: float = 1e-3
    block_length: int | None = None
    reveal_per_block: int | str = "random"
    reveal_max: int = 4
    reveal_order: str = "confidence"
    k_steps: int = 1
    # optimisation
    batch_size: int = 8
    eval_batch_size: int | None = None
    grad_accum: int = 1
    lr: float = 1e-3
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    warmup_steps: int | None = None
    warmup_ratio: float = 0.03
    min_lr_ratio: float = 0.0
    max_grad_norm: float = 1.0
    max_steps: int | None = None
    epochs: float = 1.0
    # run
    eval_every: int = 500
    save_every: int = 500
    logging_every: int = 10
    resume: bool = False
    overwrite: bool = False
    stop_after: int | None = None
    keep_checkpoint: bool = False
    seed: int = 0
    mixed_precision: str = "no"
    disable_progress: bool = False
    num_workers: int = 0
    # backbone
    trust_remote_code: bool = False
    revision: str | None = None
    backbone_family: str | None = None
    mask_token_id: int | None = None
    backbone_dtype: str = "auto"
    backbone_device_map: Any = None
    shard_backbone: bool = True
    # head
    num_hidden_layers: int = 3
    head_hidden_size: int | None = None
    num_attention_heads: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

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
