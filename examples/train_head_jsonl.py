"""Train an MRP head for a frozen backbone on a JSONL file, then decode with it.

Each line of the file is one sample, in one of three forms (docs/training.md):
    {"prompt": "What is 7 * 8?", "response": "56"}
    {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}
    {"prompt_ids": [...], "response_ids": [...]}

    python examples/train_head_jsonl.py --dataset chat.jsonl --trust-remote-code       # JetLM/SDAR-1.7B-Chat
    python examples/train_head_jsonl.py --backbone GSAI-ML/LLaDA-8B-Instruct --dataset chat.jsonl \
        --output heads/llada-8b-instruct-mrp --trust-remote-code --steps 4000
    python examples/train_head_jsonl.py --tiny          # tiny local models, CPU, seconds (see _tiny.py)

The same run from the shell (also under `accelerate launch -m mrp_hf.train ...` on several GPUs):
    mrp-hf train --backbone JetLM/SDAR-1.7B-Chat --trust-remote-code --dtype bfloat16 --dataset chat.jsonl \
        --output heads/sdar-1.7b-chat-mrp --chat-template --max-length 2048 --batch-size 4 --grad-accum 4 --steps 2000
"""

from __future__ import annotations

import argparse
import json
import os
import random
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
    parser.add_argument("--tiny", action="store_true", help="tiny local models (or MRP_EXAMPLES_TINY=1)")
    args = parser.parse_args()
    args.tiny = args.tiny or os.environ.get("MRP_EXAMPLES_TINY", "") not in ("", "0")
    if args.tiny:
        from _tiny import tiny_paths  # examples/_tiny.py: only the tiny path needs it

        args.backbone, _ = tiny_paths()
        args.output = str(Path(tempfile.mkdtemp(prefix="mrp-example-")) / "head")
        args.steps, args.batch_size, args.grad_accum, args.max_length = 3, 4, 1, 32
        args.dataset = args.dataset or write_toy_jsonl(Path(args.output).parent / "sort.jsonl")
    elif not args.dataset:
        parser.error("--dataset is required (a JSONL file, see the docstring)")
    return args


def write_toy_jsonl(path: Path, samples: int = 48) -> str:
    """A few prompt/response pairs the reference DLM's character tokenizer can spell: sort the letters."""
    rng = random.Random(0)
    with open(path, "w", encoding="utf-8") as handle:
        for _ in range(samples):
            letters = rng.sample("abcdefghijklmnop", rng.randint(3, 6))
            handle.write(json.dumps({"prompt": "sort:" + "".join(letters), "response": "".join(sorted(letters))}) + "\n")
    return str(path)


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

    # 3. What it learned, on held-out rows: a useful head predicts the backbone's next-step argmax more often
    #    than "reuse the last logits" (baseline) does.
    metrics = head.config.training.get("metrics", {})
    print(f"held-out agreement {metrics.get('agreement', float('nan')):.3f} "
          f"(baseline {metrics.get('baseline_agreement', float('nan')):.3f}), kl {metrics.get('kl', float('nan')):.3f} "
          f"(baseline {metrics.get('baseline_kl', float('nan')):.3f})")

    # 4. Use it: the head's config names its backbone, so the folder alone is enough.
    model = mrp_hf.MRPModel.from_pretrained(args.output, trust_remote_code=args.trust_remote_code)
    print(f"trained head saved to {args.output} ({sum(p.numel() for p in model.head.parameters()):,} parameters, "
          f"block length {head.config.block_length}); publish it with "
          f"mrp_hf.MRPHead.from_pretrained('{args.output}').push_to_hub('<you>/<name>')")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
