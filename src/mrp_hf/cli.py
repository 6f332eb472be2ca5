"""`mrp-hf`: command-line entry point.

Subcommands: `families`, `generate` (decode prompts with any supported backbone), `train` (train an MRP head on
a frozen backbone, docs/training.md), `demo` (every mode on the bundled reference DLM, docs/benchmarks.md),
`eval` (modes on HumanEval / GSM8K / reference tasks, docs/evaluation.md) and `lm-eval` (lm-evaluation-harness's
own command line with the `mrp-hf` model registered, docs/evaluation.md#lm-evaluation-harness).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from . import __version__


def _cmd_families(args: argparse.Namespace) -> int:
    from .backbones.registry import _ADAPTERS, _REFUSED

    rows = []
    for family, cls in sorted(_ADAPTERS.items()):
        rows.append(
            {
                "family": family,
                "model_types": list(cls.model_types),
                "architectures": list(cls.architectures),
                "attention": "block_causal" if cls.block_causal else "bidirectional",
                "shifted_logits": cls.shifted_logits,
                "padding": cls.supports_padding,
                "mask_token_id": cls.default_mask_token_id,
            }
        )
    if args.json:
        print(json.dumps({"supported": rows, "refused": _REFUSED}, indent=2))
        return 0
    print(f"{'family':<14}{'attention':<15}{'shifted':<9}{'padding':<9}{'mask id':<9}model_type / architectures")
    for r in rows:
        names = ", ".join(r["model_types"] + r["architectures"]) or "(any model with a mask token id)"
        print(
            f"{r['family']:<14}{r['attention']:<15}{str(r['shifted_logits']):<9}{str(r['padding']):<9}"
            f"{str(r['mask_token_id'] or '-'):<9}{names}"
        )
    for name, reason in _REFUSED.items():
        print(f"refused: {name}: {reason}")
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from .backbones.loading import resolve_dtype
    from .modeling_mrp import MRPModel

    dtype = resolve_dtype(args.dtype)
    model = MRPModel.from_backbone_pretrained(
        args.backbone,
        backbone_family=args.backbone_family,
        mask_token_id=args.mask_token_id,
        trust_remote_code=args.trust_remote_code,
        revision=args.revision,
        torch_dtype=dtype,
        device_map=args.device_map,
    )
    tokenizer = AutoTokenizer.from_pretrained(args.backbone, revision=args.revision, trust_remote_code=args.trust_remote_code)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    prompts = list(args.prompt)
    if args.prompts_file:
        with open(args.prompts_file, encoding="utf-8") as handle:
            prompts += [line.rstrip("\n") for line in handle if line.strip()]
    if not prompts:
        print("mrp-hf generate: give --prompt TEXT (repeatable) or --prompts-file PATH", file=sys.stderr)
        return 2
    if args.chat:
        prompts = [
            tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
            for p in prompts
        ]
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=not args.chat)
    start = time.perf_counter()
    out = model.generate(
        batch["input_ids"],
        attention_mask=batch["attention_mask"],
        max_new_tokens=args.max_new_tokens,
        block_length=args.block_length,
        threshold=args.threshold,
        temperature=args.temperature,
        seed=args.seed,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        return_dict_in_generate=True,
    )
    seconds = time.perf_counter() - start
    answers = tokenizer.batch_decode(out.sequences[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    for prompt, answer in zip(prompts, answers, strict=True):
        print(json.dumps({"prompt": prompt, "answer": answer}, ensure_ascii=False) if args.json else f"{answer}")
    stats = out.stats.to_dict()
    stats["wall_seconds"] = round(seconds, 3)
    print(json.dumps(stats), file=sys.stderr)
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from .train import run

    return run(args)


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--head", help="an MRP head folder or Hub id (default: the bundled reference head)")
    p.add_argument("--backbone", help="its backbone (default: the one named in the head's config)")
    p.add_argument("--prompts", help="prompts file (JSONL with 'prompt', or one per line); needed with --head")
    p.add_argument("--per-task", type=int, default=25, help="held-out items per reference task")
    p.add_argument("--tasks", help="comma-separated reference tasks (default: all)")
    p.add_argument("--thresholds", default="0.95,0.9,0.8,0.7,0.5,0.3", help="dynamic / remask thresholds")
    p.add_argument("--draft-tokens", default="2,3,4", help="speculative drafts per round (K), comma-separated")
    p.add_argument("--direct-tokens", type=int, default=2, help="head steps per backbone forward in direct mode")
    p.add_argument("--remask-rule", choices=["confidence", "residual"], default="confidence")
    p.add_argument("--remask-delta", type=float, default=None, help="|C| limit of the residual rule (default 1.5)")
    p.add_argument("--batch-size", type=int, default=1, help="prompts per generate call (1: latency regime)")
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--timing-repeats", type=int, default=1, help="decode each batch N times, keep the fastest time")
    p.add_argument("--output", help="folder for results.jsonl (resumable), rows.json and plot.png")
    p.add_argument("--json", dest="json_path", help="write the rows as a JSON list here")
    p.add_argument("--plot", help="write the PNG plot here (default: OUTPUT/plot.png when --output is given)")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--device", default=None, help='e.g. "cuda" (default: the CPU)')


def _cmd_demo(args: argparse.Namespace) -> int:
    from .reference.demo import run_demo

    plot = args.plot or (f"{args.output}/plot.png" if args.output else None)
    result = run_demo(
        head=args.head, backbone=args.backbone, prompts_file=args.prompts, per_task=args.per_task,
        thresholds=tuple(float(t) for t in args.thresholds.split(",") if t.strip()),
        draft_tokens=tuple(int(k) for k in str(args.draft_tokens).split(",") if k.strip()), direct_tokens=args.direct_tokens, remask_rule=args.remask_rule,
        remask_delta=args.remask_delta,
        batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, output_dir=args.output,
        json_path=args.json_path, plot_path=plot, progress=not args.no_progress,
        trust_remote_code=args.trust_remote_code,
        tasks=tuple(args.tasks.split(",")) if args.tasks else None, timing_repeats=args.timing_repeats,
        device=args.device,
    )
    print(result["table"])
    if plot:
        print(f"plot: {plot}")
    return 0


class UsageError(Exception):
    """A user error in a command's arguments: printed as one line "mrp-hf <command>: <message>", exit status 2."""


def _cmd_eval(args: argparse.Namespace) -> int:
    """`mrp-hf eval`: every mode on the same prompts of one task; results.jsonl (resumable), rows.json, plot.png."""
    from pathlib import Path

    import torch

    from .evaluation import format_table, run_modes

    modes = _eval_modes(args)
    task = _eval_task(args)
    torch.manual_seed(args.seed)
    model, tokenizer = _eval_model(args)
    output = Path(args.output) if args.output else None
    rows = run_modes(
        model, tokenizer, task, modes, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
        block_length=args.block_length, generate_kwargs={"seed": args.seed, "temperature": args.temperature},
        output_dir=output, chat=True if args.chat else (False if args.no_chat else None), limit=args.limit,
        progress=not args.no_progress,
    )
    print(format_table(rows))
    if output is not None:
        _write_eval_outputs(rows, args, output)
    return 0


def _eval_modes(args: argparse.Namespace) -> list[dict]:
    from .evaluation import parse_modes

    if not args.backbone and not args.head:
        raise UsageError("give --head PATH (its config names the backbone) and/or --backbone ID_OR_PATH")
    try:
        modes = parse_modes(args.modes)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not args.head and any(m["mode"] in ("remask", "speculative", "direct") for m in modes):
        raise UsageError("modes remask/speculative/direct need --head; with --backbone only, use static and "
                         "dynamic:THRESHOLD")
    return modes


def _eval_task(args: argparse.Namespace):
    """The task, checked before any model is loaded (e.g. refuse at once when generated code cannot be sandboxed)."""
    from .evaluation import get_task
    from .evaluation.sandbox import SandboxConfig, SandboxUnavailableError, sandbox_status

    task_kwargs = {}
    if args.task in ("gsm8k", "jsonl"):
        if not args.data:
            raise UsageError(f"--task {args.task} needs --data PATH (a JSONL file)")
        task_kwargs["path"] = args.data
    elif args.data and args.task == "humaneval":
        task_kwargs["path"] = args.data
    if args.task == "humaneval":
        task_kwargs["sandbox"] = SandboxConfig(allow_unsandboxed=args.unsafe_exec)
    try:
        task = get_task(args.task, **task_kwargs)
        task.check_ready()
    except (ValueError, SandboxUnavailableError) as exc:
        raise UsageError(str(exc)) from None
    sandbox = getattr(task, "sandbox", None)
    if isinstance(sandbox, SandboxConfig) and not sandbox_status(sandbox).available:
        print("mrp-hf eval: WARNING: --unsafe-exec: generated code runs WITHOUT a sandbox, with your user's access "
              f"to files, network and processes ({sandbox_status(sandbox).reason}); see docs/security.md",
              file=sys.stderr)
    return task


def _eval_model(args: argparse.Namespace):
    """(MRPModel, tokenizer): the head with its own (or the given) backbone, or the backbone alone."""
    from transformers import AutoTokenizer

    from .backbones import load_backbone
    from .backbones.loading import resolve_dtype
    from .modeling_mrp import MRPHead, MRPModel, _base_model_location

    load = {"trust_remote_code": args.trust_remote_code, "torch_dtype": resolve_dtype(args.dtype)}
    if args.head:
        backbone = load_backbone(args.backbone, **load) if args.backbone else None
        model = MRPModel.from_pretrained(args.head, backbone=backbone, **({} if backbone is not None else load))
        tokenizer_source = args.backbone or _base_model_location(
            MRPHead.config_class.from_pretrained(args.head).base_model_name_or_path, args.head
        )
    else:
        model = MRPModel.from_backbone_pretrained(args.backbone, **load)
        tokenizer_source = args.backbone
    if args.device:
        model.to(args.device)
    return model, AutoTokenizer.from_pretrained(tokenizer_source, trust_remote_code=args.trust_remote_code)


def _write_eval_outputs(rows: list[dict], args: argparse.Namespace, output) -> None:
    from .evaluation import plot_rows, write_json

    meta = {"task": args.task, "backbone": args.backbone, "head": args.head, "max_new_tokens": args.max_new_tokens,
            "block_length": args.block_length, "seed": args.seed, "temperature": args.temperature,
            "unsafe_exec": args.unsafe_exec}
    write_json(rows, output / "rows.json", **meta)
    try:
        plot_rows(rows, output / "plot.png")
    except ImportError:
        print("mrp-hf eval: matplotlib is missing, no plot (pip install 'mrp-hf[eval]')", file=sys.stderr)
    print(f"wrote {output / 'results.jsonl'}, {output / 'rows.json'}, {output / 'plot.png'}")


LM_EVAL_USAGE = """usage: mrp-hf lm-eval [lm-eval arguments ...]

Runs lm-evaluation-harness's command line (`lm-eval ...`) with the model `mrp-hf` registered; `--model mrp-hf`
is added when no --model is given. Example:
  mrp-hf lm-eval --model_args head=HEAD,mrp_mode=speculative --tasks gsm8k --batch_size 8 --output_path runs/x
Data parallel: accelerate launch --multi_gpu --num_processes N -m mrp_hf.cli lm-eval ...
  (CPU processes: ACCELERATE_USE_CPU=true with the same command, or torchrun --nproc_per_node N -m mrp_hf.cli lm-eval ...)
Model args and what lands in the results: docs/evaluation.md#lm-evaluation-harness; lm-eval's own options:
mrp-hf lm-eval run --help
"""


def _cmd_lm_eval(argv: list[str]) -> int:
    """`mrp-hf lm-eval ...`: lm-eval's own CLI entry point, with `import mrp_hf.lm_eval` done first."""
    if argv[:1] in (["-h"], ["--help"]):
        print(LM_EVAL_USAGE)
        return 0
    try:
        from lm_eval.__main__ import cli_evaluate

        from . import lm_eval as backend
    except ImportError as exc:
        print(f"mrp-hf lm-eval: {exc}", file=sys.stderr)
        return 2
    argv = list(argv)
    is_run = bool(argv) and argv[0] not in ("ls", "validate")
    if is_run and not any(a in ("--model", "-M") or a.startswith("--model=") for a in argv):
        after = 1 if argv[0] == "run" else 0  # lm-eval also takes the run options without the word "run"
        argv = argv[:after] + ["--model", backend.MODEL_NAME] + argv[after:]
    saved, sys.argv = sys.argv, ["lm-eval", *argv]
    backend.MRPLM.last_instance = None
    try:
        cli_evaluate()
    except SystemExit as exc:  # lm-eval's argparse exits on bad arguments and --help
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved
    model = backend.MRPLM.last_instance
    if model is not None and model.rank == 0 and model.stats_dict():
        print(f"mrp-hf stats: {json.dumps(model.stats_dict())}", file=sys.stderr)
    return 0


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backbone", help="Hub id or local folder of the DLM (optional with --head)")
    parser.add_argument("--head", help="MRP head folder or repo (MRPModel.from_pretrained); needed by MRP modes")
    parser.add_argument("--task", default="humaneval", help="humaneval | gsm8k | jsonl | reference")
    parser.add_argument("--data", help="JSONL file for gsm8k/jsonl (or a HumanEval .jsonl.gz)")
    parser.add_argument("--modes", default="static,dynamic:0.9,dynamic:0.5,remask:0.5,speculative:3,direct:2",
                        help="comma-separated: static, dynamic:T, remask:T, speculative:K, direct:K")
    parser.add_argument("--limit", type=int, default=None, help="only the first N items")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--block-length", type=int, default=None)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--output", help="folder for results.jsonl (resumable), rows.json and plot.png")
    chat = parser.add_mutually_exclusive_group()
    chat.add_argument("--chat", action="store_true", help="force the chat template")
    chat.add_argument("--no-chat", action="store_true", help="never use the chat template")
    parser.add_argument("--trust-remote-code", action="store_true")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto")
    parser.add_argument("--device", default=None, help='e.g. "cuda:0" (default: where the model loads)')
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--unsafe-exec", action="store_true",
                        help="HumanEval: if no working bubblewrap sandbox exists, execute generated code WITHOUT one "
                             "instead of refusing (only for code you trust; docs/security.md)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mrp-hf", description="Multi-token Residual Prediction for diffusion LMs.")
    parser.add_argument("--version", action="version", version=f"mrp-hf {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    fam = sub.add_parser("families", help="list the supported DLM families and how the engine sees them")
    fam.add_argument("--json", action="store_true")
    fam.set_defaults(func=_cmd_families)

    gen = sub.add_parser("generate", help="decode prompts with a DLM backbone (static or dynamic decoding)")
    gen.add_argument("--backbone", required=True, help="Hub id or local folder of the DLM")
    gen.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for a batch)")
    gen.add_argument("--prompts-file", help="a text file with one prompt per line")
    gen.add_argument("--chat", action="store_true", help="wrap prompts with the tokenizer's chat template")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--block-length", type=int, default=None)
    gen.add_argument("--threshold", type=float, default=None, help="dynamic decoding threshold (default: static)")
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--backbone-family", default=None)
    gen.add_argument("--mask-token-id", type=int, default=None)
    gen.add_argument("--trust-remote-code", action="store_true")
    gen.add_argument("--revision", default=None)
    gen.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto")
    gen.add_argument("--device-map", default=None, help='e.g. "auto" or "cuda:0"')
    gen.add_argument("--json", action="store_true", help="one JSON object per answer")
    gen.set_defaults(func=_cmd_generate)

    from .train import add_train_arguments

    train = sub.add_parser("train", help="train an MRP head on a frozen DLM backbone (see docs/training.md)")
    add_train_arguments(train)
    train.set_defaults(func=_cmd_train)

    demo = sub.add_parser("demo", help="every decoding mode side by side on the bundled reference DLM + head")
    add_demo_arguments(demo)
    demo.set_defaults(func=_cmd_demo)

    ev = sub.add_parser("eval", help="accuracy and speed of several decoding modes on one task (docs/evaluation.md)")
    add_eval_arguments(ev)
    ev.set_defaults(func=_cmd_eval)

    # parsed by lm-eval itself (see `main`); listed here for `mrp-hf --help`
    sub.add_parser("lm-eval", help="lm-evaluation-harness's CLI with the `mrp-hf` model registered (mrp-hf lm-eval -h)",
                   add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["lm-eval"]:  # every later argument is lm-eval's, including -h
        return _cmd_lm_eval(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"mrp-hf {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
