"""What `confidence_resolution` does to static and speculative decoding on the bundled reference DLM + head.

Static decoding reveals the most confident masked position; speculative decoding is accepted only where the
head's draft picks the same position and token. On the reference tasks most positions of a block are
near-certain, and which one is "most confident" is decided by differences below 1e-3, which the head cannot
reproduce (docs/benchmarks.md counts the rejections). `confidence_resolution=r` rounds the proposer's confidences
to multiples of r (ties go to the leftmost position) for every decision of every mode, so static and speculative
still share one proposer and speculative stays identical to static; the table shows what that does to static's
accuracy and to speculative's tokens per forward and wall-clock. Resolution 0 means exact confidences (None).

    OMP_NUM_THREADS=1 python benchmarks/bench_tie_resolution.py --resolutions 0,0.001,0.05,0.2
"""

from __future__ import annotations

import argparse
import json

import torch

from mrp_hf.evaluation.runner import format_table, run_modes
from mrp_hf.reference import held_out_items, load_reference


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolutions", default="0,0.001,0.05,0.2")
    parser.add_argument("--per-task", type=int, default=25)
    parser.add_argument("--draft-tokens", default="3")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model, tokenizer = load_reference()
    items = held_out_items(per_task=args.per_task)
    modes = ["static", *(f"speculative:{k}" for k in args.draft_tokens.split(","))]
    results = []
    for resolution in (float(r) for r in args.resolutions.split(",")):
        rows = run_modes(model, tokenizer, items, modes, batch_size=1, max_new_tokens=24, progress=False,
                         generate_kwargs={"temperature": 0.0, "confidence_resolution": resolution or None})
        print(f"confidence resolution {resolution:g}\n{format_table(rows).split(chr(10) * 2)[0]}\n", flush=True)
        results.append({"resolution": resolution, "rows": rows})
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2, default=str)
    return results


if __name__ == "__main__":
    main()
