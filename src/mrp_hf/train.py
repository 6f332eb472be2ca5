"""`python -m mrp_hf.train` / `accelerate launch -m mrp_hf.train` / `mrp-hf train`: train an MRP head.

    mrp-hf train --backbone GSAI-ML/LLaDA-8B-Instruct --trust-remote-code --dataset data.jsonl \\
        --output heads/llada-mrp --max-length 2048 --batch-size 4 --grad-accum 4 --steps 2000

Every flag maps onto a field of `mrp_hf.training.MRPTrainingConfig` (see docs/training.md).
"""

from __future__ import annotations

import argparse
import json
import sys


def _reveal_per_block(value: str) -> int | str:
    if value == "random":
        return value
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: give a positive int or 'random'") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: give a positive int or 'random'")
    return number


def add_train_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The `train` flags (shared by `mrp-hf train` and `python -m mrp_hf.train`)."""
    io = parser.add_argument_group("backbone, data and output")
    io.add_argument("--backbone", required=True, help="Hub id or local folder of the DLM backbone")
    io.add_argument("--dataset", required=True, help="JSONL ({prompt,response} or {messages}) or a datasets folder")
    io.add_argument("--output", required=True, help="output folder for the head (config.json + model.safetensors)")
    io.add_argument("--eval-file", default=None, help="held-out data (same formats); default: --eval-fraction")
    io.add_argument("--eval-fraction", type=float, default=0.05, help="held-out fraction of --dataset (default 0.05)")
    io.add_argument("--tokenizer", default=None, help="tokenizer id/folder (default: the backbone's)")
    io.add_argument("--trust-remote-code", action="store_true")
    io.add_argument("--revision", default=None)
    io.add_argument("--backbone-family", default=None)
    io.add_argument("--mask-token-id", type=int, default=None)
    io.add_argument("--dtype", dest="backbone_dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                    help="dtype the frozen backbone is loaded in")
    io.add_argument("--backbone-device-map", default=None, help='e.g. "auto": split a large backbone (one process only)')
    io.add_argument("--no-shard-backbone", dest="shard_backbone", action="store_false",
                    help="under an accelerate FSDP config, keep a full backbone copy per process instead of sharding its layers")
    io.add_argument("--max-length", type=int, default=1024)
    io.add_argument("--packing", action="store_true", help="pack samples into rows of --max-length")
    io.add_argument("--chat-template", action="store_true", help="wrap {prompt,response} rows in the chat template")
    io.add_argument("--no-eos", dest="append_eos", action="store_false", help="do not end responses with EOS")

    obj = parser.add_argument_group("objective")
    obj.add_argument("--objective", choices=["kl", "ce"], default="kl")
    obj.add_argument("--block-length", type=int, default=None, help="reveal block (default: the model's block)")
    obj.add_argument("--reveal-per-block", type=_reveal_per_block, default="random",
                     help="reveals per block per step: an int or 'random' (1..--reveal-max)")
    obj.add_argument("--reveal-max", type=int, default=4)
    obj.add_argument("--reveal-order", choices=["confidence", "random"], default="confidence")
    obj.add_argument("--k-steps", type=int, default=1, help="chained head steps (K + 1 backbone forwards per batch)")
    obj.add_argument("--mask-eps", type=float, default=1e-3)

    opt = parser.add_argument_group("optimisation")
    opt.add_argument("--batch-size", type=int, default=8, help="rows per process per micro-batch")
    opt.add_argument("--eval-batch-size", type=int, default=None)
    opt.add_argument("--grad-accum", type=int, default=1)
    opt.add_argument("--lr", type=float, default=1e-3)
    opt.add_argument("--weight-decay", type=float, default=0.0)
    opt.add_argument("--warmup-steps", type=int, default=None)
    opt.add_argument("--warmup-ratio", type=float, default=0.03)
    opt.add_argument("--max-grad-norm", type=float, default=1.0)
    length = opt.add_mutually_exclusive_group()
    length.add_argument("--steps", dest="max_steps", type=int, default=None, help="optimizer steps (wins over --epochs)")
    length.add_argument("--epochs", type=float, default=1.0)

    run = parser.add_argument_group("run")
    run.add_argument("--eval-every", type=int, default=500)
    run.add_argument("--save-every", type=int, default=500)
    run.add_argument("--logging-every", type=int, default=10)
    start = run.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true",
                       help="continue from OUTPUT/checkpoint (a finished run: say so and exit 0)")
    start.add_argument("--overwrite", action="store_true",
                       help="delete OUTPUT's checkpoint and trained head and start over (without --resume or "
                            "--overwrite, an OUTPUT holding either is refused)")
    run.add_argument("--stop-after", type=int, default=None, help="checkpoint and stop after N steps of this run")
    run.add_argument("--keep-checkpoint", action="store_true", help="keep OUTPUT/checkpoint after the run")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--mixed-precision", choices=["no", "bf16", "fp16"], default="no")
    run.add_argument("--num-workers", type=int, default=0)
    run.add_argument("--no-progress", dest="disable_progress", action="store_true")

    head = parser.add_argument_group("head")
    head.add_argument("--num-layers", dest="num_hidden_layers", type=int, default=3)
    head.add_argument("--head-hidden-size", type=int, default=None)
    head.add_argument("--num-heads", dest="num_attention_heads", type=int, default=None)
    head.add_argument("--head-config", default=None, help='extra MRPConfig fields as JSON, e.g. \'{"intermediate_size": 4096}\'')
    return parser


_NOT_CONFIG = {"backbone", "dataset", "output", "eval_file", "tokenizer", "head_config", "command", "func"}


def config_from_args(args: argparse.Namespace):
    from .training import MRPTrainingConfig

    values = {k: v for k, v in vars(args).items() if k not in _NOT_CONFIG}
    values["eval_dataset"] = args.eval_file
    return MRPTrainingConfig(**values)


def run(args: argparse.Namespace) -> int:
    from accelerate import PartialState

    from .training import NoSpaceLeftError, OutputExistsError, TrainingDataError, TrainingInterrupted, train_head

    _log_to_stderr()
    config = config_from_args(args)
    overrides = json.loads(args.head_config) if args.head_config else {}
    try:
        head = train_head(args.backbone, args.dataset, args.output, tokenizer=args.tokenizer, config=config, **overrides)
    except TrainingInterrupted as stop:
        if PartialState().is_main_process:
            print(f"mrp-hf train: {stop}", file=sys.stderr)
        return {"SIGINT": 130, "SIGTERM": 143}.get(stop.reason, 75)  # 75: stopped early on purpose, resume later
    except (TrainingDataError, OutputExistsError, NoSpaceLeftError) as error:  # the user's to fix: no traceback
        if PartialState().is_main_process:
            print(f"mrp-hf train: error: {error}", file=sys.stderr)
        return 1 if isinstance(error, NoSpaceLeftError) else 2
    metrics = head.config.training.get("metrics")
    if PartialState().is_main_process:
        print(json.dumps({"output": args.output, "steps": head.config.training["steps"], "metrics": metrics}))
    return 0


def _log_to_stderr() -> None:
    """Show the library's INFO messages (held-out metrics, resume) on the main process."""
    import logging
    import os

    # not PartialState(): created before the Accelerator, it would miss a multi-CPU launch (ACCELERATE_USE_CPU)
    library = logging.getLogger("mrp_hf")
    if not library.handlers and os.environ.get("RANK", "0") == "0":
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[mrp-hf] %(message)s"))
        library.addHandler(handler)
        library.setLevel(logging.INFO)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mrp_hf.train", description="Train an MRP head on a frozen DLM backbone.")
    return add_train_arguments(parser)


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
