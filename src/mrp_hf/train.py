"""`python -m mrp_hf.train` / `accelerate launch -m mrp_hf.train` / `mrp-hf train`: train an MRP head.

    mrp-hf train --backbone GSAI-ML/LLaDA-8B-Instruct --trust-remote-code --dataset data.jsonl \\
        --output heads/llada-mrp --max-length 2048 --batch-size 4 --grad-accum 4 --steps 2000

The flags are `transformers.HfArgumentParser` over `TrainCommandArguments` (backbone, data, output) and
`mrp_hf.training.MRPTrainingConfig`: every field is a flag (`--max-length` or `--max_length`), with the field's
default and help text; `mrp-hf train --help` lists them (see docs/training.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field


@dataclass
class TrainCommandArguments:
    """What `mrp-hf train` needs besides the `MRPTrainingConfig`."""

    _argument_group_name = "backbone, data and output"

    backbone: str = field(metadata={"help": "Hub id or local folder of the DLM backbone"})
    dataset: str = field(metadata={"help": "JSONL ({prompt,response} or {messages}) or a datasets folder"})
    output: str = field(metadata={"help": "output folder for the head (config.json + model.safetensors)"})
    tokenizer: str | None = field(default=None, metadata={"help": "tokenizer id/folder; None: the backbone's"})
    head_config: str | None = field(
        default=None, metadata={"help": 'extra MRPConfig fields as JSON, e.g. \'{"intermediate_size": 4096}\''}
    )


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


def build_parser(prog: str = "mrp_hf.train") -> argparse.ArgumentParser:
    """The `train` flags (shared by `mrp-hf train` and `python -m mrp_hf.train`). Imports transformers: the
    `mrp-hf` entry point builds it only when the `train` command runs."""
    from transformers import HfArgumentParser

    from .training import MRPTrainingConfig

    parser = HfArgumentParser(
        (TrainCommandArguments, MRPTrainingConfig), prog=prog,
        usage="%(prog)s --backbone ID_OR_PATH --dataset DATA --output DIR [options] (-h: every option)",
        description="Train an MRP head on a frozen DLM backbone (docs/training.md).",
    )
    # HfArgumentParser takes an argument's type from the field's annotation; three fields need another reader
    # on the command line: an int or "random", two floats, and a device map given as a string
    for action in parser._actions:
        if action.dest == "reveal_per_block":
            action.type = _reveal_per_block
        elif action.dest == "adam_betas":
            action.type, action.nargs = float, 2
        elif action.dest == "backbone_device_map":
            action.type = str
        elif action.option_strings and action.option_strings[0].startswith("--no_"):
            action.help, action.default = f"turn off --{action.dest.replace('_', '-')}", argparse.SUPPRESS
        elif action.required:
            action.default = argparse.SUPPRESS  # no "(default: None)" in the help
    # the short form used since the first release (HfArgumentParser adds --no-append-eos)
    parser.add_argument("--no-eos", dest="append_eos", action="store_false", default=argparse.SUPPRESS,
                        help="do not end responses with EOS (same as --no-append-eos)")
    return parser


def parse_train_args(argv: list[str] | None = None, prog: str = "mrp_hf.train"):
    """(`TrainCommandArguments`, `MRPTrainingConfig`) from the command line; a config the checks refuse (e.g.
    --resume with --overwrite) or an unknown flag exits with argparse's one-line error and status 2."""
    parser = build_parser(prog)
    try:
        command, config = parser.parse_args_into_dataclasses(args=argv, look_for_args_file=False)
    except ValueError as error:
        parser.error(str(error))
    return command, config


def run(command: TrainCommandArguments, config) -> int:
    from accelerate import PartialState

    from .training import NoSpaceLeftError, OutputExistsError, TrainingDataError, TrainingInterrupted, train_head

    _log_to_stderr()
    overrides = json.loads(command.head_config) if command.head_config else {}
    try:
        head = train_head(command.backbone, command.dataset, command.output, tokenizer=command.tokenizer,
                          config=config, **overrides)
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
        print(json.dumps({"output": command.output, "steps": head.config.training["steps"], "metrics": metrics}))
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


def main(argv: list[str] | None = None, prog: str = "mrp_hf.train") -> int:
    return run(*parse_train_args(argv, prog))


if __name__ == "__main__":
    sys.exit(main())
