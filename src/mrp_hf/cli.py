"""`mrp-hf`: command-line entry point.

Subcommands: `families`, `generate` (decode prompts with any supported backbone), `train` (train an MRP head on
a frozen backbone, docs/training.md), `calibrate` (a head's draft graph shape, docs/modes.md#draft-graphs), `demo` (every mode on the bundled reference DLM, docs/benchmarks.md),
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
    """`mrp-hf generate`: decode prompts with a backbone (static or dynamic), or with a head in an MRP mode."""
    prompts = list(args.prompt)
    if args.prompts_file:
        with open(args.prompts_file, encoding="utf-8") as handle:
            prompts += [line.rstrip("\n") for line in handle if line.strip()]
    if not prompts:
        raise UsageError("give --prompt TEXT (repeatable) or --prompts-file PATH")
    model, tokenizer = _generation_model(args, "generate")
    if args.chat:
        prompts = [
            tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
            for p in prompts
        ]
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=not args.chat)
    options = {"max_new_tokens": args.max_new_tokens, "block_length": args.block_length, "threshold": args.threshold,
               "mrp_mode": args.mrp_mode, "mrp_draft_tokens": args.draft_tokens,
               "mrp_draft_graph": _draft_graph_option(args.draft_graph), "mrp_drafter": args.drafter}
    start = time.perf_counter()
    out = model.generate(
        batch["input_ids"].to(model.device), attention_mask=batch["attention_mask"].to(model.device),
        temperature=args.temperature, seed=args.seed, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, return_dict_in_generate=True,
        **{name: value for name, value in options.items() if value is not None},  # unset: the model's own defaults
    )
    seconds = time.perf_counter() - start
    answers = tokenizer.batch_decode(out.sequences[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    for prompt, answer in zip(prompts, answers, strict=True):
        print(json.dumps({"prompt": prompt, "answer": answer}, ensure_ascii=False) if args.json else f"{answer}")
    stats = out.stats.to_dict()
    stats["wall_seconds"] = round(seconds, 3)
    print(json.dumps(stats), file=sys.stderr)
    return 0


def _draft_graph_option(value: str | None):
    """--draft-graph: a shape name ("tree-2x2") or comma-separated branchings ("3,2,1")."""
    if value is None or not value.replace(",", "").strip().isdigit():
        return value
    return [int(part) for part in value.split(",")]


def _generation_model(args: argparse.Namespace, command: str):
    """(MRPModel, left-padding tokenizer) for `generate`: --reference, --head (with its or the given backbone),
    or --backbone alone; the torch threads chosen for it (`_choose_threads`)."""
    from transformers import AutoTokenizer

    from .backbones.loading import load_mrp_model, resolve_dtype

    if args.reference:
        from .reference import bundled

        if args.backbone or args.head:
            raise UsageError("--reference loads the bundled reference DLM and head; do not combine it with --backbone/--head")
        args.backbone, args.head = str(bundled.backbone_path()), str(bundled.head_path())
    if not args.backbone and not args.head:
        raise UsageError("give --backbone ID_OR_PATH, --head PATH (its config names the backbone), or --reference")
    head_free = args.mrp_mode == "speculative" and getattr(args, "drafter", None) == "backbone"
    if args.mrp_mode not in (None, "off") and not args.head and not head_free:
        also = " (or --drafter backbone: drafts from the backbone itself)" if args.mrp_mode == "speculative" else ""
        raise UsageError(f"--mrp-mode {args.mrp_mode} needs a trained head: add --head PATH (or use --reference){also}")
    load = {"trust_remote_code": args.trust_remote_code, "revision": args.revision,
            "torch_dtype": resolve_dtype(args.dtype), "device_map": args.device_map}
    identity = {"backbone_family": args.backbone_family, "mask_token_id": args.mask_token_id}
    model, source = load_mrp_model(args.head, args.backbone, load, identity)
    _choose_threads(args, command, model)
    tokenizer = AutoTokenizer.from_pretrained(source, revision=None if args.head else args.revision,
                                              trust_remote_code=args.trust_remote_code)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


#: below this many backbone parameters a CPU forward is a few ms of many small operations: extra OpenMP threads
#: mostly wait for each other, and on a machine where other processes hold cores they wait much longer
SMALL_MODEL_PARAMETERS = 100_000_000


def _choose_threads(args: argparse.Namespace, command: str, model=None) -> None:
    """torch's CPU threads: --threads N, else 1 for a small model on the CPU (torch's default of one thread per core
    made the demo 20x slower on a busy 2-core machine, docs/benchmarks.md), else torch's default. Says what it chose."""
    import torch

    threads = getattr(args, "threads", None)
    why = "--threads"
    if threads is None and model is None:  # the demo, before it loads the (small) bundled model
        threads, why = 1, "the default for the bundled model; --threads N to change"
    elif threads is None:
        on_cpu = model.device.type == "cpu"
        size = sum(p.numel() for p in model.adapter.model.parameters())
        if not on_cpu or size >= SMALL_MODEL_PARAMETERS:
            return
        threads, why = 1, "a small model on the CPU; --threads N to change"
    if threads < 1:
        raise UsageError(f"--threads {threads}: give a positive number of threads")
    torch.set_num_threads(threads)
    print(f"mrp-hf {command}: {threads} torch thread{'s' if threads > 1 else ''} ({why})", file=sys.stderr)


def add_calibrate_arguments(cal: argparse.ArgumentParser) -> None:
    cal.add_argument("--head", required=True, help="a local MRP head folder (its generation_config.json is written)")
    cal.add_argument("--backbone", help="its backbone (default: the one named in the head's config)")
    cal.add_argument("--prompts", required=True, help="held-out prompts: JSONL with 'prompt', or one per line")
    cal.add_argument("--budgets", default="4,8,16,32", help="node budgets (nodes per verify forward, root included)")
    cal.add_argument("--budget", default="auto",
                     help="the shape stored as mrp_draft_graph: a node budget of --budgets, or 'auto': the budgets' "
                          "shape that decodes the prompts fastest on this machine (timed against the base decoding)")
    cal.add_argument("--timing-repeats", type=int, default=3, help="with --budget auto: interleaved timed passes")
    cal.add_argument("--threshold", type=float, default=None, help="calibrate over dynamic decoding at this threshold")
    cal.add_argument("--drafter", choices=["head", "backbone"], default="head", help="who drafts (mrp_drafter)")
    cal.add_argument("--max-depth", type=int, default=8, help="deepest graph considered")
    cal.add_argument("--max-width", type=int, default=4, help="widest branching considered")
    cal.add_argument("--max-new-tokens", type=int, default=None, help="default: the model's generation_config.json")
    cal.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0: calibrate for sampling")
    cal.add_argument("--seed", type=int, default=0, help="keys the sampling draws")
    cal.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                     help="auto: the checkpoint's own")
    cal.add_argument("--trust-remote-code", action="store_true", help="run the backbone's own modeling code from its repo")
    cal.add_argument("--threads", type=int, default=None,
                     help="torch CPU threads (default: 1 for a model under 100M parameters on the CPU, else torch's)")
    cal.add_argument("--dry-run", action="store_true", help="print the choices, write nothing")
    cal.add_argument("--json", action="store_true", help="print the whole record as JSON")


def _cmd_calibrate(args: argparse.Namespace) -> int:
    """`mrp-hf calibrate`: choose a draft graph shape per node budget from the ranks the drafter gives the base
    decoding's steps on held-out prompts (generation/calibration.py); store the --budget one in the head folder."""
    import os

    from .generation.calibration import (
        calibration_record,
        choose_shapes,
        measured_speedups,
        record_traces,
        write_head_calibration,
    )
    from .reference.demo import load_prompts

    budgets = sorted({int(b) for b in args.budgets.split(",")})
    budget = args.budget if args.budget == "auto" else int(args.budget) if args.budget.isdigit() else None
    if budget is None or (budget != "auto" and budget not in budgets):
        raise UsageError(f"--budget {args.budget} is neither 'auto' nor among --budgets {args.budgets}; add it there")
    if not args.dry_run and not os.path.isdir(args.head):
        raise UsageError(f"--head {args.head} is not a local folder: calibrate writes its generation_config.json; "
                         f"download the head first, or pass --dry-run")
    args.reference, args.mrp_mode, args.revision, args.device_map = False, None, None, None
    args.backbone_family = args.mask_token_id = None
    model, tokenizer = _generation_model(args, "calibrate")
    prompts = [tokenizer(item["prompt"], return_tensors="pt")["input_ids"] for item in load_prompts(args.prompts)]
    options = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "seed": args.seed,
               "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    traces, tokens, extra = record_traces(model, prompts, threshold=args.threshold, drafter=args.drafter,
                                          depth=args.max_depth, width=args.max_width,
                                          **{k: v for k, v in options.items() if v is not None})
    speedups = None
    if budget == "auto":  # which budget's shape is fastest here is measured, on the same prompts
        shapes = list(dict.fromkeys(c.branching for c in choose_shapes(traces, tokens, budgets, args.max_depth,
                                                                       args.max_width)))
        speedups = measured_speedups(model, prompts, shapes, drafter=args.drafter, threshold=args.threshold,
                                     repeats=args.timing_repeats, **{k: v for k, v in options.items() if v is not None})
    record = calibration_record(traces, tokens, extra, budgets, args.max_depth, args.max_width, speedups)
    record.update(prompts=len(prompts), drafter=args.drafter, threshold=args.threshold,
                  base="static" if args.threshold is None else "dynamic", temperature=args.temperature)
    for nodes, row in record["budgets"].items():
        print(f"budget {nodes:>3} nodes: mrp_draft_graph={row['mrp_draft_graph']} ({row['nodes']} nodes), "
              f"{row['forwards']} forwards for {tokens} tokens ({row['tokens_per_forward']} per forward; base "
              f"decoding: {record['base_forwards']})")
    if speedups is not None:
        row = record["fastest"]
        print(f"fastest here: mrp_draft_graph={row['mrp_draft_graph']} ({row['nodes']} nodes), {row['forwards']} "
              f"forwards, measured {row['measured_speedup_vs_base']}x the base decoding's speed (CPU seconds; "
              f"every budget's shape: {record['measured_speedups']})")
        if row["measured_speedup_vs_base"] <= 1:
            print(f"note: no calibrated shape decodes faster than the base decoding on this machine with the "
                  f"{args.drafter} drafting (its drafts or its verify forwards cost more than they save here)")
    if args.dry_run:
        print("--dry-run: nothing written", file=sys.stderr)
    else:
        stored = write_head_calibration(args.head, record, budget)
        print(f"wrote mrp_draft_graph={stored['mrp_draft_graph']} (budget {budget}) to "
              f"{os.path.join(args.head, 'generation_config.json')}", file=sys.stderr)
    if args.json:
        print(json.dumps(record))
    return 0


def _cmd_train(argv: list[str]) -> int:
    """`mrp-hf train ...`: its own parser (`HfArgumentParser` over the training config, which imports
    transformers), built only when the command runs so that `mrp-hf --help` stays fast."""
    from .train import main as train_main

    return train_main(argv, prog="mrp-hf train")


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--head", help="an MRP head folder or Hub id (default: the bundled reference head)")
    p.add_argument("--backbone", help="its backbone (default: the one named in the head's config)")
    p.add_argument("--prompts", help="prompts file (JSONL with 'prompt', or one per line); needed with --head")
    p.add_argument("--per-task", type=int, default=25, help="held-out items per reference task")
    p.add_argument("--tasks", help="comma-separated reference tasks (default: all)")
    p.add_argument("--thresholds", default="0.95,0.9,0.8,0.7,0.5,0.3", help="dynamic / remask thresholds")
    p.add_argument("--draft-tokens", default="2,3,4", help="speculative drafts per round (K), comma-separated")
    p.add_argument("--direct-tokens", type=int, default=2, help="head steps per backbone forward in direct mode")
    p.add_argument("--remask-rule", choices=["confidence", "residual"], default="confidence",
                   help="which reveals remask revokes (docs/modes.md)")
    p.add_argument("--remask-delta", type=float, default=None, help="|C| limit of the residual rule (default 1.5)")
    p.add_argument("--batch-size", type=int, default=1, help="prompts per generate call (1: latency regime)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: the model's generation_config.json")
    p.add_argument("--timing-repeats", type=int, default=1, help="decode each batch N times, keep the fastest time")
    p.add_argument("--output", help="folder for results.jsonl (resumable), rows.json and plot.png")
    p.add_argument("--json", dest="json_path", help="write the rows as a JSON list here")
    p.add_argument("--plot", help="write the PNG plot here (default: OUTPUT/plot.png when --output is given)")
    p.add_argument("--trust-remote-code", action="store_true", help="run the backbone's own modeling code from its repo")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: 1, fastest for the bundled model, and on a busy machine by far)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--device", default=None, help='e.g. "cuda" (default: the CPU)')


def _cmd_demo(args: argparse.Namespace) -> int:
    from .reference.demo import run_demo

    _choose_threads(args, "demo")
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
    if args.head is None:
        print(TRY_NEXT)
    return 0


TRY_NEXT = """
Try next on the same bundled model (docs/quickstart.md):
  mrp-hf generate --reference --prompt "sort:dcba" --mrp-mode speculative
  mrp-hf eval --reference --limit 8
  python -c "from mrp_hf.reference import bundled; print(bundled.backbone_path(), bundled.head_path())"   # its folders"""


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
    _choose_threads(args, "eval", model)
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

    if args.reference:
        from .reference import bundled

        if args.backbone or args.head:
            raise UsageError("--reference evaluates the bundled reference DLM and head; do not combine it with --backbone/--head")
        args.head = str(bundled.head_path())
        args.task = args.task or "reference"
    args.task = args.task or "humaneval"
    if not args.backbone and not args.head:
        raise UsageError("give --head PATH (its config names the backbone) and/or --backbone ID_OR_PATH, or --reference")
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

    from .backbones.loading import load_mrp_model, resolve_dtype

    load = {"trust_remote_code": args.trust_remote_code, "torch_dtype": resolve_dtype(args.dtype)}
    model, tokenizer_source = load_mrp_model(args.head, args.backbone, load)
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
    parser.add_argument("--reference", action="store_true",
                        help="the bundled reference DLM and head (task reference unless --task says otherwise)")
    parser.add_argument("--task", default=None, help="humaneval | gsm8k | jsonl | reference (default: humaneval; "
                                                     "reference with --reference)")
    parser.add_argument("--data", help="JSONL file for gsm8k/jsonl (or a HumanEval .jsonl.gz)")
    parser.add_argument("--modes", default="static,dynamic:0.9,dynamic:0.5,remask:0.5,speculative:3,direct:2",
                        help="comma-separated: static, dynamic:T, remask:T, speculative:K, direct:K")
    parser.add_argument("--limit", type=int, default=None, help="only the first N items")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per generate call")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="answer length (default: the model's generation_config.json, else 128)")
    parser.add_argument("--block-length", type=int, default=None, help="default: the model's own")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: 1 for a model under 100M parameters on the CPU, else torch's)")
    parser.add_argument("--output", help="folder for results.jsonl (resumable), rows.json and plot.png")
    chat = parser.add_mutually_exclusive_group()
    chat.add_argument("--chat", action="store_true", help="force the chat template")
    chat.add_argument("--no-chat", action="store_true", help="never use the chat template")
    parser.add_argument("--trust-remote-code", action="store_true", help="run the backbone's own modeling code from its repo")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                        help="auto: the checkpoint's own")
    parser.add_argument("--device", default=None, help='e.g. "cuda:0" (default: where the model loads)')
    parser.add_argument("--seed", type=int, default=0, help="keys the sampling draws")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--unsafe-exec", action="store_true",
                        help="HumanEval: if no working bubblewrap sandbox exists, execute generated code WITHOUT one "
                             "instead of refusing (only for code you trust; docs/security.md)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mrp-hf", description="Multi-token Residual Prediction for diffusion LMs.")
    parser.add_argument("--version", action="version", version=f"mrp-hf {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)

    fam = sub.add_parser("families", help="list the supported DLM families and how the engine sees them")
    fam.add_argument("--json", action="store_true", help="machine-readable output")
    fam.set_defaults(func=_cmd_families)

    gen = sub.add_parser("generate", help="decode prompts with a DLM backbone, or with a head in an MRP mode",
                         formatter_class=DefaultsHelpFormatter)
    where = gen.add_argument_group("model")
    where.add_argument("--backbone", help="Hub id or local folder of the DLM (optional with --head)")
    where.add_argument("--head", help="an MRP head folder or Hub id; its config names the backbone")
    where.add_argument("--reference", action="store_true", help="the bundled reference DLM and head (try it offline)")
    gen.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for a batch)")
    gen.add_argument("--prompts-file", help="a text file with one prompt per line")
    gen.add_argument("--chat", action="store_true", help="wrap prompts with the tokenizer's chat template")
    gen.add_argument("--mrp-mode", choices=["off", "speculative", "remask", "direct"], default=None,
                     help="MRP decoding mode (needs --head); default: the model's generation_config.json, else off")
    gen.add_argument("--draft-tokens", type=int, default=None, help="K: drafts per round (speculative) or head steps (direct)")
    gen.add_argument("--draft-graph", default=None,
                     help="speculative: a draft graph ('chain', 'tree-2x2' or branchings '3,2,1'); default: the head's "
                          "calibrated one, else the chain")
    gen.add_argument("--drafter", choices=["head", "backbone"], default=None,
                     help="speculative: who drafts; 'backbone' needs no head (default: head)")
    gen.add_argument("--max-new-tokens", type=int, default=None,
                     help="answer length (default: the model's generation_config.json, else 128)")
    gen.add_argument("--block-length", type=int, default=None, help="default: the model's own")
    gen.add_argument("--threshold", type=float, default=None, help="dynamic decoding threshold (unset: static)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    gen.add_argument("--seed", type=int, default=0, help="keys the sampling draws")
    gen.add_argument("--backbone-family", default=None, help="force a family (mrp-hf families); default: detected")
    gen.add_argument("--mask-token-id", type=int, default=None, help="default: the model's or its tokenizer's")
    gen.add_argument("--trust-remote-code", action="store_true", help="run the backbone's own modeling code from its repo")
    gen.add_argument("--revision", default=None, help="the backbone's Hub revision")
    gen.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                     help="auto: the checkpoint's own")
    gen.add_argument("--device-map", default=None, help='e.g. "auto" or "cuda:0"')
    gen.add_argument("--threads", type=int, default=None,
                     help="torch CPU threads (default: 1 for a model under 100M parameters on the CPU, else torch's)")
    gen.add_argument("--json", action="store_true", help="one JSON object per answer")
    gen.set_defaults(func=_cmd_generate)

    # parsed by `mrp_hf.train` (see `main`); listed here for `mrp-hf --help`
    sub.add_parser("train", help="train an MRP head on a frozen DLM backbone (mrp-hf train -h; docs/training.md)",
                   add_help=False)

    cal = sub.add_parser("calibrate", help="choose a head's draft graph shape from held-out prompts (docs/modes.md)",
                         formatter_class=DefaultsHelpFormatter)
    add_calibrate_arguments(cal)
    cal.set_defaults(func=_cmd_calibrate)

    demo = sub.add_parser("demo", help="every decoding mode side by side on the bundled reference DLM + head",
                          formatter_class=DefaultsHelpFormatter)
    add_demo_arguments(demo)
    demo.set_defaults(func=_cmd_demo)

    ev = sub.add_parser("eval", help="accuracy and speed of several decoding modes on one task (docs/evaluation.md)",
                        formatter_class=DefaultsHelpFormatter)
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
    if argv[:1] == ["train"]:
        return _cmd_train(argv[1:])
    debug = "--debug" in argv  # accepted anywhere, not only before the command
    args = build_parser().parse_args([a for a in argv if a != "--debug"])
    args.debug = debug
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"mrp-hf {args.command}: {exc}", file=sys.stderr)
        return 2
    except (ValueError, OSError, NotImplementedError) as exc:
        # what a user's input caused (a missing folder, a model that does not fit, a bad value): the message says
        # what and how to fix it, in one line; --debug shows where
        if args.debug:
            raise
        print(f"mrp-hf {args.command}: {_one_line(exc)}", file=sys.stderr)
        return 1


def _one_line(exc: BaseException) -> str:
    from .backbones.loading import ModelSourceError

    text = " ".join(str(exc).split())
    return text if isinstance(exc, ModelSourceError) else f"{type(exc).__name__}: {text} (--debug: the traceback)"


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Each option's help ends with its default (argparse's ArgumentDefaultsHelpFormatter skips options without a
    help text and prints "(default: None)" and "(default: False)", which say nothing)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        default = action.default
        if (
            "default" in help_text or default is None or default is False or default == argparse.SUPPRESS
            or default == []
            or not action.option_strings or isinstance(action, argparse._StoreTrueAction)
        ):
            return help_text
        return f"{help_text} (default: {default})".strip()


if __name__ == "__main__":
    sys.exit(main())
