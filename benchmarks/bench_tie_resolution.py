"""What speculative decoding would gain if static decoding's reveal order did not hinge on tiny confidence
differences: an experiment on the bundled reference DLM + head, not a feature of the library.

Static decoding reveals the most confident masked position; speculative decoding is accepted only where the
head's draft picks the same position and token. On the reference tasks most positions of a block are
near-certain, and which one is "most confident" is decided by differences below 1e-3, which the head cannot
reproduce (docs/benchmarks.md counts the rejections). Here the proposer's confidence is rounded to a grid of
`--resolution` (ties go to the leftmost position, as `top_k_positions` does) for EVERY mode of the run, so
static and speculative still share one proposer and speculative stays identical to static; the table shows
what that does to static's accuracy and to speculative's tokens per forward and wall-clock. Resolution 0 is the
library as it is. (Rounding also moves dynamic thresholds slightly, which is why this is not the default.)

    OMP_NUM_THREADS=1 python benchmarks/bench_tie_resolution.py --resolutions 0,0.001,0.05,0.2
"""

from __future__ import annotations

import argparse
import json

import torch

from mrp_hf.evaluation.runner import format_table, run_modes
from mrp_hf.generation import sampling
from mrp_hf.reference import held_out_items, load_reference

EXACT_CONFIDENCE = sampling.TokenProposer._confidence


def use_resolution(resolution: float) -> None:
    """Patch the proposer: confidences rounded to multiples of `resolution` (0: unchanged)."""
    if not resolution:
        sampling.TokenProposer._confidence = EXACT_CONFIDENCE
        return

    def rounded(self, probs, tokens, row_key, position, committed):
        return torch.round(EXACT_CONFIDENCE(self, probs, tokens, row_key, position, committed) / resolution) * resolution

    sampling.TokenProposer._confidence = rounded


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
    try:
        for resolution in (float(r) for r in args.resolutions.split(",")):
            use_resolution(resolution)
            rows = run_modes(model, tokenizer, items, modes, batch_size=1, max_new_tokens=24,
                             generate_kwargs={"temperature": 0.0}, progress=False)
            print(f"confidence resolution {resolution:g}\n{format_table(rows).split(chr(10) * 2)[0]}\n", flush=True)
            results.append({"resolution": resolution, "rows": rows})
    finally:
        use_resolution(0)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2, default=str)
    return results


if __name__ == "__main__":
    main()
