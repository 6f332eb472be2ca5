"""Train an MRP head for a frozen backbone on a JSONL file, then decode with it.

Each line of the file is one sample, in one of three forms (docs/training.md):
    {"prompt": "What is 7 * 8?", "response": "56"}
    {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}
    {"prompt_ids": [...], "response_ids": [...]}

    python examples/train_head_jsonl.py --dataset chat.jsonl --trust-remote-code       # JetLM/SDAR-1.7B-Chat
    python examples/train_head_jsonl.py --backbone GSAI-ML/LLaDA-8B-Instruct --dataset chat.jsonl \
        --output heads/llada-8b-instruct-mrp --trust-remote-code --steps 4000
    python examples/train_head_jsonl.py --tiny          # the bundled reference model, CPU, seconds

The same run from the shell (also under `accelerate launch -m mrp_hf.train ...` on several GPUs):
    mrp-hf train --backbone JetLM/SDAR-1.7B-Chat --trust-remote-code --dtype bfloat16 --dataset chat.jsonl \
        --output heads/sdar-1.7b-chat-mrp --chat-template --max-length 2048 --batch-size 4 --grad-accum 4 --steps 2000
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import torch

import mrp_hf
from mrp_hf.training import MRPTrainingConfig, train_head


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbone", default="JetLM/SDAR-1.7B-Chat", help="Hub id or folder of the frozen DLM")
    parser.add_argument("--dataset", help="JSONL file (required unless --tiny)")
    parser.add_argument("--output", default="heads/sdar-1.7b-chat-mrp", help="the head's folder")
    parser.add_argument("--steps", type=int, default=2000, help="optimizer steps")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--grad-accum", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--trust-remote-code", action="store_true", help="run the model repo's own Python code")
    parser.add_argument("--tiny", action="store_true", help="the bundled reference model (or MRP_EXAMPLES_TINY=1)")
    args = parser.parse_args()
    args.tiny = args.tiny or os.environ.get("MRP_EXAMPLES_TINY", "") not in ("", "0")
    if args.tiny:
        from _tiny import tiny_dataset, tiny_paths  # examples/_tiny.py: only the tiny path needs it

        args.backbone, _ = tiny_paths()
        args.output = str(Path(tempfile.mkdtemp(prefix="mrp-example-")) / "head")
        # a short run that shows the mechanics; held-out gains take thousands of steps (see step 3)
        args.steps, args.batch_size, args.grad_accum, args.max_length = 20, 16, 1, 64
        args.dataset = args.dataset or tiny_dataset(Path(args.output).parent, samples=1200)
    elif not args.dataset:
        parser.error("--dataset is required (a JSONL file, see the docstring)")
    return args


def main() -> int:
    args = parse_args()
    gpu = torch.cuda.is_available()

    # 1. The settings (every field is also a `mrp-hf train` flag). The backbone stays frozen: only the head's
    #    own weights are trained and saved.
    config = MRPTrainingConfig(
        max_steps=args.steps,
        batch_size=args.batch_size,
        grad_accum=args.grad_accum,
        max_length=args.max_length,
        lr=1e-3,                        # the reference recipe: AdamW, lr 1e-3, cosine decay
        k_steps=1,                      # chained head steps per sample (2-3 helps speculative acceptance)
        num_hidden_layers=1 if args.tiny else 3,
        chat_template=not args.tiny,    # wrap prompt/response rows in the chat format the sampler will see
        trust_remote_code=args.trust_remote_code,
        backbone_dtype="bfloat16" if gpu else "float32",
        mixed_precision="bf16" if gpu else "no",
        eval_every=max(1, args.steps // 4),
        save_every=500,                 # checkpoints for --resume; SIGINT/SIGTERM also checkpoint
        disable_progress=args.tiny,
    )

    # 2. Train. Accepts a Hub id / folder (the tokenizer is loaded from it) or a backbone already in memory.
    head = train_head(args.backbone, args.dataset, args.output, config=config)

    # 3. What it learned, on held-out rows. The head predicts how the backbone's logits change after the next
    #    reveal. The baseline is C = 0: "the logits stay as they are". KL: how far the prediction is from the
    #    backbone's real next-step distribution (lower is better); agreement: how often their argmax matches.
    #    A confident backbone (like the bundled reference model) keeps its argmax after most reveals, so
    #    agreement starts near 1 for both and the gain shows in the KL.
    metrics = head.config.training.get("metrics", {})
    nan = float("nan")
    print(f"held-out KL to the backbone's next step: {metrics.get('kl', nan):.4f} with the head, "
          f"{metrics.get('baseline_kl', nan):.4f} with C = 0 (lower is better)")
    print(f"held-out argmax agreement: {metrics.get('agreement', nan):.4f} with the head, "
          f"{metrics.get('baseline_agreement', nan):.4f} with C = 0")
    if args.tiny:  # what a full run reaches, for comparison: the bundled head's own record
        from mrp_hf.reference import bundled

        full = mrp_hf.MRPHead.config_class.from_pretrained(bundled.head_path()).training or {}
        done = full.get("metrics") or {}
        print(f"(a {args.steps}-step run moves the held-out figures little; the bundled head, {full.get('steps')} steps, "
              f"reached KL {done.get('kl', nan):.4f} against {done.get('baseline_kl', nan):.4f} with C = 0)")

    # 4. Use it: the head's config names its backbone, so the folder alone is enough.
    model = mrp_hf.MRPModel.from_pretrained(args.output, trust_remote_code=args.trust_remote_code)
    print(f"trained head saved to {args.output} ({sum(p.numel() for p in model.head.parameters()):,} parameters, "
          f"block length {head.config.block_length}); publish it with "
          f"mrp_hf.MRPHead.from_pretrained('{args.output}').push_to_hub('<you>/<name>')")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
