"""Effect of the approximate (Fast-dLLM-style) prefix cache on a bidirectional model's output.

Decodes the same random prompts with prefix_cache=False and prefix_cache=True on the Dream stand-in (a
tiny random bidirectional model with shifted logits) and reports how many answer tokens agree and the
wall-clock ratio. A random tiny model is a harsh case: its attention is not peaked the way a trained
model's is, so the stale prefix KV changes more of its decisions. For the exact cache of block-causal
families the same comparison is a unit test (identical output), not a benchmark.

    python benchmarks/bench_prefix_cache.py [--prompts 32] [--json out.json]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--block-length", type=int, default=8)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        model = mrp_hf.MRPModel.from_backbone(
            load_stand_in("dream", tmp, hidden_size=128, intermediate_size=256, num_hidden_layers=4), mask_token_id=126
        )
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, 120, (args.prompts, 16), generator=gen)
    rows = []
    for cache in (False, True):
        start = time.perf_counter()
        out = model.generate(
            prompts, max_new_tokens=args.max_new_tokens, block_length=args.block_length, prefix_cache=cache,
            return_dict_in_generate=True,
        )
        rows.append((cache, out.sequences[:, 16:], time.perf_counter() - start))
    same = (rows[0][1] == rows[1][1]).float()
    result = {
        "prompts": args.prompts,
        "token_agreement": round(float(same.mean()), 4),
        "identical_answers": int(same.all(dim=1).sum()),
        "first_block_agreement": round(float(same[:, : args.block_length].mean()), 4),
        "seconds_no_cache": round(rows[0][2], 3),
        "seconds_cache": round(rows[1][2], 3),
        "speedup": round(rows[0][2] / rows[1][2], 3),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
