"""`mrp-hf demo`: every decoding mode side by side, on the bundled reference DLM + head (or any head).

Steps of `run_demo` (the comments in the code repeat them):
    1. Load the backbone and head: the bundled reference checkpoints, or `head` (a folder or Hub id, its
       backbone from its config or `backbone`).
    2. The prompts: the reference tasks' held-out split (with exact checkers), or a prompts file (no checker:
       the table then shows agreement with static decoding instead of accuracy).
    3. Decode them in every mode with the evaluation runner (static first: it is the baseline of every
       ratio; the modes take turns on each batch, so machine load shifts them alike): dynamic and remask at
       each threshold, speculative at each K, direct.
    4. Report: the table (its columns explained under it), the targets (speculative: identical to static,
       tokens per forward, speed-up; remask: the points dynamic decoding lost that it recovers, and its margin
       over every dynamic setting at least as fast), the plot (accuracy against wall-clock speed-up with the
       Pareto frontier, next to accuracy against tokens per forward) and the JSON rows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..jsonl import jsonl_lines
from . import bundled

DEFAULT_THRESHOLDS = (0.95, 0.9, 0.8, 0.7, 0.5, 0.3)
DEFAULT_DRAFT_TOKENS = (2, 3, 4)
#: draft graphs (docs/modes.md#draft-graphs): a head-drafted tree, a chain drafted by the backbone itself (no head),
#: and a head-free tree over dynamic decoding at each threshold; each must equal its base decoding token for token
DEFAULT_DRAFT_GRAPHS = (
    {"mrp_draft_graph": "tree-3x2x1"},
    {"mrp_draft_graph": "chain-7", "mrp_drafter": "backbone"},
    *({"mrp_draft_graph": "tree-3x2x1", "mrp_drafter": "backbone", "threshold": t} for t in DEFAULT_THRESHOLDS),
)


def demo_modes(thresholds=DEFAULT_THRESHOLDS, draft_tokens=DEFAULT_DRAFT_TOKENS, direct_tokens: int = 2,
               remask_rule: str = "confidence", remask_delta: float | None = None,
               draft_graphs=DEFAULT_DRAFT_GRAPHS) -> list[dict[str, Any]]:
    """static, dynamic@t and remask@t for each threshold, speculative at each K (drafts per round; an int or a
    sequence), the draft graphs (speculative with `mrp_draft_graph`: dicts of generate arguments; one over a
    threshold needs dynamic decoding at that threshold among `thresholds` to compare with), direct (K head steps)."""
    modes: list[dict[str, Any]] = [{"mode": "static"}]
    modes += [{"mode": "dynamic", "threshold": t} for t in thresholds]
    rule = {} if remask_rule == "confidence" else {"remask_rule": remask_rule}  # the default stays out of labels
    if remask_delta is not None:
        rule["remask_delta"] = remask_delta
    modes += [{"mode": "remask", "threshold": t, **rule} for t in thresholds]
    drafts = (draft_tokens,) if isinstance(draft_tokens, int) else tuple(draft_tokens)
    modes += [{"mode": "speculative", "mrp_draft_tokens": k} for k in drafts]
    modes += [{"mode": "speculative", **graph} for graph in draft_graphs
              if graph.get("threshold") is None or graph["threshold"] in thresholds]
    modes.append({"mode": "direct", "mrp_draft_tokens": direct_tokens})
    return modes


def load_prompts(path: str | Path) -> list[dict[str, Any]]:
    """A prompts file: JSONL with a "prompt" field (and optional "id"), or plain text, one prompt per line."""
    items = []
    for number, line in enumerate(jsonl_lines(path, parse=False)):
        if line.problem:
            raise ValueError(f"{line.location}: {line.problem}")
        text = line.text.rstrip("\r\n")
        try:
            record = json.loads(text) if text.lstrip().startswith("{") else {"prompt": text}
        except json.JSONDecodeError as err:
            raise ValueError(f"{line.location}: not valid JSON ({err.msg}); a JSON line needs a 'prompt' field") from None
        if "prompt" not in record:
            raise ValueError(f"{line.location} has no 'prompt' field.")
        items.append({"id": str(record.get("id", number)), "prompt": record["prompt"]})
    if not items:
        raise ValueError(f"{path} holds no prompts.")
    return items


#: the targets of issue 15 (docs/benchmarks.md): speculative identical to static with >= 2.0 tokens per forward
#: and >= 1.3x static's wall-clock; remask >= 3 points above every dynamic setting at least as fast, and faster
#: than static; dynamic decoding loses >= 20 points at some threshold (so that there is something to recover)
SPECULATIVE_MIN_TPF, SPECULATIVE_MIN_SPEEDUP = 2.0, 1.3
REMASK_MIN_MARGIN, DYNAMIC_MIN_LOSS = 0.03, 0.20


def summarize_targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The project's targets, read off one run: see docs/benchmarks.md."""
    static = rows[0]
    out: dict[str, Any] = {"speculative": [
        {"draft_tokens": r["mrp_draft_tokens"], "identical_to_static": r["identical_to_static"],
         "tokens_per_forward": r["tokens_per_forward"], "speedup_vs_static": r["speedup_vs_static"],
         "met": bool(r["identical_to_static"] and r["tokens_per_forward"] >= SPECULATIVE_MIN_TPF
                     and (r["speedup_vs_static"] or 0) >= SPECULATIVE_MIN_SPEEDUP)}
        for r in rows if r["mode"] == "speculative" and not r.get("draft_graph")
    ]}
    out["draft_graphs"] = _draft_graph_report(rows)
    if static["accuracy"] is None:
        return out
    dynamic = [r for r in rows if r["mode"] == "dynamic"]
    remask_report = []
    for r in dynamic:
        twin = next((x for x in rows if x["mode"] == "remask" and x["threshold"] == r["threshold"]), None)
        if twin is None:
            continue
        lost = static["accuracy"] - r["accuracy"]
        remask_report.append({
            "threshold": r["threshold"], "static_accuracy": static["accuracy"], "dynamic_accuracy": r["accuracy"],
            "remask_accuracy": twin["accuracy"], "points_lost_by_dynamic": 100 * lost,
            "share_recovered": (twin["accuracy"] - r["accuracy"]) / lost if lost > 0 else None,
            "wall_vs_dynamic": twin["wall_seconds"] / r["wall_seconds"] if r["wall_seconds"] else None,
            "tokens_per_forward_dynamic": r["tokens_per_forward"], "tokens_per_forward_remask": twin["tokens_per_forward"],
        })
    out["remask"] = remask_report
    out["frontier"] = _remask_against_dynamic_frontier(rows, dynamic)
    out["dynamic_max_points_lost"] = max((x["points_lost_by_dynamic"] for x in remask_report), default=None)
    return out


def _draft_graph_report(rows) -> list[dict[str, Any]]:
    """Each draft-graph row against its base (static, or dynamic at its threshold) and the head's chain (K=3):
    identical to the base, tokens per forward, backbone forwards and wall-clock against both (issue-16 targets:
    over static >= 3.0 tokens per forward and >= 1.6x static; over dynamic <= 0.7x its forwards)."""
    def find(**want):
        return next((r for r in rows if all(r.get(k) == v for k, v in want.items()) and not r.get("draft_graph")), None)

    chain = find(mode="speculative", mrp_draft_tokens=3)
    report = []
    for r in (x for x in rows if x.get("draft_graph")):
        base = find(mode="dynamic", threshold=r["threshold"]) if r["base"] == "dynamic" else rows[0]
        report.append({
            "label": r["label"], "base": r["base"], "identical_to_base": r["identical_to_base"],
            "tokens_per_forward": r["tokens_per_forward"],
            "forwards_vs_base": r["backbone_forwards"] / base["backbone_forwards"] if base else None,
            "speedup_vs_base": base["wall_seconds"] / r["wall_seconds"] if base and r["wall_seconds"] else None,
            "speedup_vs_chain": chain["wall_seconds"] / r["wall_seconds"] if chain and r["base"] == "static" else None,
        })
    return report


def _remask_against_dynamic_frontier(rows, dynamic) -> dict[str, Any]:
    """Each remask threshold against every dynamic setting at least as fast (wall-clock): the accuracy margin over
    the best of them (None when no dynamic setting is as fast); met if a remask setting faster than static has a
    margin of at least REMASK_MIN_MARGIN."""
    points = []
    for r in (x for x in rows if x["mode"] == "remask"):
        rivals = [d for d in dynamic if d["speedup_vs_static"] >= r["speedup_vs_static"]]
        best = max(rivals, key=lambda d: d["accuracy"]) if rivals else None
        points.append({
            "threshold": r["threshold"], "accuracy": r["accuracy"], "speedup_vs_static": r["speedup_vs_static"],
            "best_dynamic_at_least_as_fast": best["label"] if best else None,
            "margin_points": 100 * (r["accuracy"] - best["accuracy"]) if best else None,
        })
    met = any(p["speedup_vs_static"] > 1 and (p["margin_points"] is None or p["margin_points"] >= 100 * REMASK_MIN_MARGIN)
              for p in points)
    return {"remask": points, "met": met}


def format_targets(targets: dict[str, Any]) -> str:
    lines = []
    for spec in targets.get("speculative", []):
        lines.append(
            f"speculative K={spec['draft_tokens']}: identical to static: {spec['identical_to_static']}; tokens/forward "
            f"{spec['tokens_per_forward']:.2f} (target >= {SPECULATIVE_MIN_TPF}); speed-up {spec['speedup_vs_static']:.2f}x "
            f"(target >= {SPECULATIVE_MIN_SPEEDUP}x): {'met' if spec['met'] else 'missed'}"
        )
    for r in targets.get("remask", []):
        if r["share_recovered"] is None:
            recovered = "nothing to recover"
        else:
            recovered = f"remask recovers {100 * r['share_recovered']:.0f}% of them"
        lines.append(
            f"remask @ {r['threshold']:g}: dynamic loses {r['points_lost_by_dynamic']:.1f} points; {recovered}; "
            f"remask at {r['wall_vs_dynamic']:.2f}x dynamic's wall-clock"
        )
    frontier = targets.get("frontier")
    if frontier:
        for p in frontier["remask"]:
            rival = ("no dynamic setting is as fast" if p["best_dynamic_at_least_as_fast"] is None else
                     f"{p['margin_points']:+.1f} points vs the best dynamic at least as fast "
                     f"({p['best_dynamic_at_least_as_fast']})")
            lines.append(f"remask @ {p['threshold']:g}: {p['speedup_vs_static']:.2f}x static; {rival}")
        lines.append(f"remask above dynamic's frontier (>= {100 * REMASK_MIN_MARGIN:.0f} points, faster than static): "
                     f"{'met' if frontier['met'] else 'missed'}")
    for g in targets.get("draft_graphs", []):
        chain = "" if g["speedup_vs_chain"] is None else f", {g['speedup_vs_chain']:.2f}x the K=3 chain"
        lines.append(f"draft graph {g['label']}: identical to {g['base']}: {g['identical_to_base']}; tokens/forward "
                     f"{g['tokens_per_forward']:.2f}; {g['forwards_vs_base']:.2f}x {g['base']}'s forwards; "
                     f"{g['speedup_vs_base']:.2f}x {g['base']}'s speed{chain}")
    if targets.get("dynamic_max_points_lost") is not None:
        lines.append(f"dynamic decoding loses at most {targets['dynamic_max_points_lost']:.1f} points "
                     f"(target: >= {100 * DYNAMIC_MIN_LOSS:.0f} at some threshold)")
    return "\n".join(lines)


def run_demo(
    head: str | None = None,
    backbone: str | None = None,
    prompts_file: str | None = None,
    per_task: int = 25,
    thresholds=DEFAULT_THRESHOLDS,
    draft_tokens=DEFAULT_DRAFT_TOKENS,
    direct_tokens: int = 2,
    remask_rule: str = "confidence",
    remask_delta: float | None = None,
    batch_size: int = 1,
    max_new_tokens: int | None = None,
    output_dir: str | None = None,
    json_path: str | None = None,
    plot_path: str | None = None,
    progress: bool = True,
    trust_remote_code: bool = False,
    tasks: tuple[str, ...] | None = None,
    timing_repeats: int = 1,
    device: str | None = None,
) -> dict[str, Any]:
    """Run the demo; returns {"rows": [...], "targets": {...}, "table": str}."""
    from ..evaluation.runner import format_table, plot_rows, run_modes, write_json
    from .tasks import ANSWER_LENGTH, held_out_items

    # 1. backbone and head
    if head is None:
        model, tokenizer = bundled.load_reference(with_head=True)
    else:
        from transformers import AutoTokenizer

        from ..backbones.loading import load_mrp_model

        model, source = load_mrp_model(head, backbone, {"trust_remote_code": trust_remote_code})
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    if device is not None:
        model.to(device)
    # 2. prompts
    if prompts_file is not None:
        items: list[Any] = load_prompts(prompts_file)
    elif head is None:
        items = held_out_items(per_task=per_task, tasks=tasks)
    else:
        raise ValueError("with --head, give --prompts FILE (the reference tasks only fit the bundled model).")
    # 3. every mode on the same prompts
    rows = run_modes(
        model, tokenizer, items, demo_modes(thresholds, draft_tokens, direct_tokens, remask_rule, remask_delta),
        batch_size=batch_size, max_new_tokens=max_new_tokens or ANSWER_LENGTH, output_dir=output_dir,
        generate_kwargs={"temperature": 0.0}, progress=progress, timing_repeats=timing_repeats,
    )
    # 4. report
    targets = summarize_targets(rows)
    if json_path:  # the rows as a list of objects
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(rows, indent=2, default=str) + "\n", encoding="utf-8")
    if output_dir:
        write_json(rows, Path(output_dir) / "rows.json", targets=targets)
    if plot_path:
        source = "the bundled reference DLM + head" if head is None else head
        plot_rows(rows, plot_path, title=f"mrp-hf demo on {source}: {len(items)} prompts, batch {batch_size}")
    return {"rows": rows, "targets": targets, "table": format_table(rows) + "\n\n" + format_targets(targets)}
