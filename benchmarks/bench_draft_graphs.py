"""Draft graphs (`mrp_draft_graph`) against the base decoding and the MRP chain, on one model, in one run.

Batch 1 (each prompt alone), one torch thread. For each setting: backbone forwards, head forwards, tokens per
backbone forward, seconds (median over `--repeats` interleaved repeats, each a pass over every prompt, with the
spread min-max), the speed-up over the base decoding (static, or dynamic at the same threshold) and over the
chain (`mrp_mode="speculative"` without a graph, the head's `mrp_draft_tokens` chain, static base only), and
whether every output equals the base decoding's token for token. Settings:
- static; the chain (head); each graph of `--graphs` drafted by the head and by the backbone itself
  (`mrp_drafter="backbone"`, no head: auto-speculation, so the head's contribution is the difference);
- the calibrated graphs: for each budget of `--budgets`, the shape `mrp-hf calibrate` chooses (generation/
  calibration.py) from other held-out prompts (`--calibration-per-task` per task, another seed), per drafter;
- for each threshold of `--thresholds`: dynamic decoding, and the graphs of `--dynamic-graphs` over it (head and
  head-free);
- the verify's lookahead measured by its absence: the head's chain and each head-free graph again with
  `verify_lookahead=False` (`--no-lookahead-contrast` leaves these out).
Seconds are wall-clock (`time.perf_counter`) and CPU seconds of this process (`time.process_time`, which a busy
shared machine disturbs less); ratios are taken per repeat and their median reported.

Model: the bundled reference DLM + head (default), or `--head FOLDER` (its backbone from its config, or
`--backbone`). Prompts: the reference tasks' held-out items (`--per-task` of each task).

`--verify-sweep 1,2,4,8,16,32` instead measures what a verify forward costs by node count, stacked and packed, per
family that can pack (the stand-ins of bench_verify_layout.py and the reference DLM; batch 1, CPU seconds,
medians of interleaved repeats): the figure a node budget stands for.

    OMP_NUM_THREADS=1 python benchmarks/bench_draft_graphs.py [--repeats 5] [--graphs chain-4,tree-2x2] [--json out.json]
    OMP_NUM_THREADS=1 python benchmarks/bench_draft_graphs.py --verify-sweep 1,2,4,8,16,32 [--json sweep.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import mrp_hf
from mrp_hf.reference import held_out_items
from mrp_hf.reference.bundled import backbone_path, head_path


def load(args):
    from transformers import AutoTokenizer

    head = args.head or str(head_path())
    backbone = mrp_hf.load_backbone(args.backbone) if args.backbone else None
    model = mrp_hf.MRPModel.from_pretrained(head, backbone=backbone)
    tokenizer = AutoTokenizer.from_pretrained(args.backbone or str(backbone_path()))
    prompts = [tokenizer(item.prompt, return_tensors="pt")["input_ids"] for item in held_out_items(per_task=args.per_task)]
    return model, tokenizer, prompts


def calibrated(model, tokenizer, args) -> list[tuple[str, int, list[int]]]:
    """(drafter, budget, shape) chosen on a calibration set of held-out prompts drawn with another seed."""
    from mrp_hf.generation.calibration import calibration_record, record_traces

    items = held_out_items(per_task=args.calibration_per_task, seed=args.calibration_seed)
    prompts = [tokenizer(item.prompt, return_tensors="pt")["input_ids"] for item in items]
    out = []
    for drafter in ("head", "backbone"):
        traces, tokens, extra = record_traces(model, prompts, drafter=drafter, depth=args.max_depth, width=4)
        record = calibration_record(traces, tokens, extra, args.budgets, args.max_depth, 4)
        out += [(drafter, int(budget), row["mrp_draft_graph"]) for budget, row in record["budgets"].items()]
    return out


def settings(args, calibrated_shapes=()) -> list[dict]:
    """(label, base label, generate kwargs) rows; the base of a row is the static or dynamic row it must equal."""
    rows = [{"label": "static", "base": "static", "kwargs": {}, "graph": None, "drafter": None},
            {"label": f"chain:{args.draft_tokens} (head)", "base": "static", "graph": None, "drafter": "head",
             "kwargs": {"mrp_mode": "speculative", "mrp_draft_tokens": args.draft_tokens}}]
    def without_lookahead(row: dict) -> dict:
        return {**row, "label": f"{row['label']}, no lookahead", "kwargs": {**row["kwargs"], "verify_lookahead": False}}

    if args.lookahead_contrast:
        rows.append(without_lookahead(rows[1]))
    for graph in args.graphs:
        for drafter in ("head", "backbone"):
            rows.append({"label": f"{graph} ({drafter})", "base": "static", "graph": graph, "drafter": drafter,
                         "kwargs": {"mrp_mode": "speculative", "mrp_draft_graph": graph, "mrp_drafter": drafter,
                                    "mrp_draft_tokens": args.draft_tokens}})
        if args.lookahead_contrast:
            rows.append(without_lookahead(rows[-1]))
    for drafter, budget, shape in calibrated_shapes:
        rows.append({"label": f"calibrated, {budget} nodes: {shape} ({drafter})", "base": "static", "graph": shape,
                     "drafter": drafter, "kwargs": {"mrp_mode": "speculative", "mrp_draft_graph": shape,
                                                    "mrp_drafter": drafter}})
    for threshold in args.thresholds:
        base = f"dynamic@{threshold}"
        rows.append({"label": base, "base": base, "kwargs": {"threshold": threshold}, "graph": None, "drafter": None})
        for graph in args.dynamic_graphs:
            for drafter in ("head", "backbone"):
                rows.append({"label": f"{graph} ({drafter}) @{threshold}", "base": base, "graph": graph,
                             "drafter": drafter,
                             "kwargs": {"mrp_mode": "speculative", "mrp_draft_graph": graph, "mrp_drafter": drafter,
                                        "threshold": threshold, "mrp_draft_tokens": args.draft_tokens}})
            if args.lookahead_contrast:
                rows.append(without_lookahead(rows[-1]))
    return rows


def one_pass(model, prompts, kwargs):
    """Every prompt alone: (outputs, backbone forwards, head forwards, tokens, wall s, CPU s)."""
    outputs, forwards, heads, tokens = [], 0, 0, 0
    wall, cpu = time.perf_counter(), time.process_time()
    for ids in prompts:
        out = model.generate(ids, return_dict_in_generate=True, **kwargs)
        outputs.append(out.sequences)
        forwards += out.stats.backbone_forwards
        heads += out.stats.head_forwards
        tokens += sum(out.stats.row_new_tokens)
    return outputs, forwards, heads, tokens, time.perf_counter() - wall, time.process_time() - cpu


def measure(model, prompts, rows, repeats: int) -> None:
    """Interleaved repeats: each repeat runs every row once, in order, so slow phases of the machine hit all rows."""
    for row in rows:  # warm-up, and the counts (deterministic: the same in every repeat)
        row["outputs"], row["backbone_forwards"], row["head_forwards"], row["tokens"], _, _ = one_pass(
            model, prompts[:2], row["kwargs"])
        row["wall"], row["cpu"] = [], []
    for _ in range(repeats):
        for row in rows:
            outputs, forwards, heads, tokens, wall, cpu = one_pass(model, prompts, row["kwargs"])
            row.update(outputs=outputs, backbone_forwards=forwards, head_forwards=heads, tokens=tokens)
            row["wall"].append(wall)
            row["cpu"].append(cpu)


def ratio(other: dict, row: dict, clock: str) -> float:
    """Median over repeats of other's seconds / row's seconds (> 1: row is faster)."""
    return statistics.median(o / m for o, m in zip(other[clock], row[clock], strict=True))


def summarize(rows: list[dict]) -> list[dict]:
    by_label = {row["label"]: row for row in rows}
    chain = next(row for row in rows if row["label"].startswith("chain:"))
    out = []
    for row in rows:
        base = by_label[row["base"]]

        out.append({
            "setting": row["label"], "base": row["base"].split("@")[0], "draft_graph": row["graph"],
            "drafter": row["drafter"], "identical_to_base": all(
                torch.equal(a, b) for a, b in zip(row["outputs"], base["outputs"], strict=True)),
            "backbone_forwards": row["backbone_forwards"], "head_forwards": row["head_forwards"],
            "forwards_vs_base": round(row["backbone_forwards"] / base["backbone_forwards"], 3),
            "tokens_per_forward": round(row["tokens"] / row["backbone_forwards"], 3),
            "wall_s": round(statistics.median(row["wall"]), 4),
            "wall_spread_s": [round(min(row["wall"]), 4), round(max(row["wall"]), 4)],
            "cpu_s": round(statistics.median(row["cpu"]), 4),
            "speedup_vs_base_wall": round(ratio(base, row, "wall"), 3), "speedup_vs_base_cpu": round(ratio(base, row, "cpu"), 3),
            "speedup_vs_chain_wall": round(ratio(chain, row, "wall"), 3) if row["base"] == "static" else None,
        })
    return out


def print_table(results: list[dict]) -> None:
    header = ("setting", "fwd", "fwd/base", "tok/fwd", "head fwd", "wall s [min, max]", "x base (wall)",
              "x base (cpu)", "x chain (wall)", "identical")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in results:
        spread = f"{r['wall_s']:.3f} [{r['wall_spread_s'][0]:.3f}, {r['wall_spread_s'][1]:.3f}]"
        chain = "" if r["speedup_vs_chain_wall"] is None else f"{r['speedup_vs_chain_wall']:.2f}"
        print(f"| {r['setting']} | {r['backbone_forwards']} | {r['forwards_vs_base']:.2f} | {r['tokens_per_forward']:.2f} "
              f"| {r['head_forwards']} | {spread} | {r['speedup_vs_base_wall']:.2f} | {r['speedup_vs_base_cpu']:.2f} "
              f"| {chain} | {r['identical_to_base']} |")


def verify_sweep(counts: list[int], repeats: int) -> list[dict]:
    """Per packable family and node count: the verify forward's CPU ms, stacked and packed (batch 1)."""
    import sys
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_verify_layout import CASES, STAND_IN_MASK_ID, STAND_IN_SIZE, VerifyTimer, reference_model
    from stand_ins import load_stand_in

    from mrp_hf.generation.config import MRPGenerationConfig
    from mrp_hf.generation.engine import DecodingEngine

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, family, prefix_cache in CASES:
            if family == "reference":
                backbone, _, ids, mask, block_length, _ = reference_model(1)
                mask_id, new_tokens = None, block_length
            else:
                backbone = load_stand_in(family, tmp, **STAND_IN_SIZE)
                mask_id, block_length, new_tokens = STAND_IN_MASK_ID, 4, 12
                ids = torch.randint(0, 120, (1, 96), generator=torch.Generator().manual_seed(0))
                mask = torch.ones_like(ids)
            adapter = mrp_hf.get_adapter(backbone, mask_token_id=mask_id)
            config = MRPGenerationConfig(max_new_tokens=new_tokens, block_length=block_length, prefix_cache=prefix_cache)
            row = {"case": label, "node_tokens": block_length, "stacked_ms": {}, "packed_ms": {}}
            for count in counts:
                timer = VerifyTimer(copies=count, repeats=repeats)
                DecodingEngine(adapter, config, block_decoder=timer).run(ids, mask)
                for layout in ("stacked", "packed"):
                    row[f"{layout}_ms"][count] = round(statistics.median(timer.seconds[layout]) * 1e3, 3)
            rows.append(row)
            print(f"| {label} | " + " | ".join(
                f"{row['stacked_ms'][c]:.2f} / {row['packed_ms'][c]:.2f}" for c in counts) + " |", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", help="an MRP head folder (default: the bundled reference head)")
    parser.add_argument("--backbone", help="its backbone folder (default: the one the head's config names)")
    parser.add_argument("--per-task", type=int, default=6, help="held-out prompts per reference task")
    parser.add_argument("--graphs", default="chain-4,chain-7,tree-2x2,tree-3x2x1,tree-2x2x2x1",
                        type=lambda s: s.split(","))
    parser.add_argument("--thresholds", default="0.9,0.7,0.5", type=lambda s: [float(t) for t in s.split(",")])
    parser.add_argument("--dynamic-graphs", default="chain-4,tree-3x2x1", type=lambda s: s.split(","))
    parser.add_argument("--draft-tokens", type=int, default=3, help="the chain's K (the head's default)")
    parser.add_argument("--budgets", default="8,16", type=lambda s: [int(b) for b in s.split(",") if b],
                        help="node budgets to calibrate a shape for ('' for none)")
    parser.add_argument("--calibration-per-task", type=int, default=6)
    parser.add_argument("--calibration-seed", type=int, default=99, help="held_out_items seed of the calibration set")
    parser.add_argument("--max-depth", type=int, default=7, help="deepest calibrated graph")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-lookahead-contrast", dest="lookahead_contrast", action="store_false",
                        help="leave out the rows with verify_lookahead=False (the head's chain, each head-free graph)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--verify-sweep", type=lambda s: [int(c) for c in s.split(",")],
                        help="node counts: measure the verify forward's cost by node count instead")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.verify_sweep:
        print(f"verify forward, CPU ms stacked / packed, batch 1, {args.threads} thread(s), median of {args.repeats}")
        print("| case | " + " | ".join(f"{c} nodes" for c in args.verify_sweep) + " |")
        print("|---|" + "---|" * len(args.verify_sweep))
        rows = verify_sweep(args.verify_sweep, args.repeats)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))
        return
    model, tokenizer, prompts = load(args)
    shapes = calibrated(model, tokenizer, args) if args.budgets else []
    rows = settings(args, shapes)
    measure(model, prompts, rows, args.repeats)
    results = summarize(rows)
    print(f"{len(prompts)} prompts, batch 1, {args.threads} thread(s), {args.repeats} interleaved repeats; "
          f"model: {args.head or 'bundled reference DLM + head'}")
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps({"prompts": len(prompts), "repeats": args.repeats, "threads": args.threads,
                                         "results": results}, indent=2))


if __name__ == "__main__":
    main()
