"""Every decoding mode side by side, on the same prompts, in one run.

Reports per mode: backbone forwards, head forwards, tokens per forward, wall-clock, speed-up against static
decoding measured in the same run, and how much of the output equals static decoding (`identical_to_static`
for every prompt, and the token agreement). Accuracy needs a task with a checker: the project's reference
DLM (not built yet) will provide one; until then this runs on a tiny random stand-in backbone, where only
the exactness, the forward counts and the overhead are meaningful (a random model's "answers" have no
accuracy, and an untrained or random head accepts few drafts).

    python benchmarks/bench_modes.py [--family sdar] [--head PATH] [--prompts 16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from stand_ins import load_stand_in  # noqa: E402

import mrp_hf  # noqa: E402

MASK_ID = 126


def timed(model, ids, mask, **kwargs):
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=mask, return_dict_in_generate=True, **kwargs)
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="sdar", choices=["llada", "dream", "sdar", "fast_dllm_v2", "llada2"])
    parser.add_argument("--head", help="an MRP head folder for this backbone (default: an untrained head)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--block-length", type=int, default=4)
    parser.add_argument("--thresholds", default="0.05,0.1,0.3")
    parser.add_argument("--draft-tokens", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        backbone = load_stand_in(args.family, tmp, hidden_size=128, intermediate_size=256, num_hidden_layers=4)
    adapter = mrp_hf.get_adapter(backbone, mask_token_id=MASK_ID)
    if args.head:
        head = mrp_hf.MRPHead.from_pretrained(args.head)
        head_note = args.head
    else:
        head = mrp_hf.MRPHead(mrp_hf.MRPConfig.for_backbone(adapter, num_hidden_layers=2))
        head_note = "untrained head (C = 0: drafts reuse the last logits)"
    model = mrp_hf.MRPModel.from_backbone(backbone, head=head.eval(), mask_token_id=MASK_ID)
    prompts = torch.randint(0, 120, (args.prompts, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(prompts)
    common = dict(max_new_tokens=args.max_new_tokens, block_length=args.block_length)
    timed(model, prompts[:2], mask[:2], **common)  # warm-up

    runs = [("static", None, {})]
    thresholds = [float(t) for t in args.thresholds.split(",")]
    runs += [("dynamic", t, {"threshold": t}) for t in thresholds]
    runs += [("remask", t, {"threshold": t, "mrp_mode": "remask"}) for t in thresholds]
    runs += [("speculative", None, {"mrp_mode": "speculative", "mrp_draft_tokens": args.draft_tokens})]
    runs += [("direct", None, {"mrp_mode": "direct", "mrp_draft_tokens": args.draft_tokens})]
    rows, static_seq, static_seconds = [], None, None
    for mode, threshold, extra in runs:
        out, seconds = timed(model, prompts, mask, **common, **extra)
        answers = out.sequences[:, prompts.shape[1] :]
        if static_seq is None:
            static_seq, static_seconds = answers, seconds
        same = answers == static_seq
        rows.append(
            {
                "mode": mode,
                "threshold": threshold,
                "accuracy": None,
                "backbone_forwards": out.stats.backbone_forwards,
                "head_forwards": out.stats.head_forwards,
                "tokens_per_forward": round(out.stats.mean_tokens_per_forward, 3),
                "wall_seconds": round(seconds, 3),
                "speedup_vs_static": round(static_seconds / seconds, 3),
                "identical_to_static": bool(same.all()),
                "token_agreement_with_static": round(float(same.float().mean()), 4),
                "accepted_drafts": out.stats.accepted_drafts,
                "revoked_reveals": out.stats.revoked_reveals,
            }
        )
    header = f"{'mode':<12}{'thr':>6}{'fwd':>6}{'head':>6}{'TPF':>7}{'sec':>8}{'x static':>10}{'= static':>10}{'agree':>8}"
    print(f"backbone: tiny random {args.family} stand-in; head: {head_note}; torch threads {torch.get_num_threads()}")
    print(header)
    for r in rows:
        print(
            f"{r['mode']:<12}{'' if r['threshold'] is None else r['threshold']:>6}{r['backbone_forwards']:>6}"
            f"{r['head_forwards']:>6}{r['tokens_per_forward']:>7}{r['wall_seconds']:>8}{r['speedup_vs_static']:>10}"
            f"{str(r['identical_to_static']):>10}{r['token_agreement_with_static']:>8}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
