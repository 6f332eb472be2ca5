"""`mrp-hf demo`: every decoding mode side by side, on the bundled reference DLM + head (or any head).

Steps of `run_demo` (the comments in the code repeat them):
    1. Load the backbone and head: the bundled reference checkpoints, or `head` (a folder or Hub id, its
       backbone from its config or `backbone`).
    2. The prompts: the reference tasks' held-out split (with exact checkers), or a prompts file (no checker:
       the table then shows agreement with static decoding instead of accuracy).
    3. Decode them in every mode with the evaluation runner (static first: it is the baseline of every
       ratio): dynamic and remask at each threshold, speculative, direct.
    4. Report: the table, the targets (speculative: identical to static, tokens per forward, speed-up;
       remask: share of the accuracy dynamic decoding lost that it recovers, and its cost against dynamic),
       the plot and the JSON rows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..jsonl import jsonl_lines
from . import bundled

DEFAULT_THRESHOLDS = (0.9, 0.7, 0.5, 0.3)


def demo_modes(thresholds=DEFAULT_THRESHOLDS, draft_tokens: int = 3, direct_tokens: int = 2,
               remask_rule: str = "confidence", remask_delta: float | None = None) -> list[dict[str, Any]]:
    """static, dynamic@t and remask@t for each threshold, speculative (K drafts), direct (K head steps)."""
    modes: list[dict[str, Any]] = [{"mode": "static"}]
    modes += [{"mode": "dynamic", "threshold": t} for t in thresholds]
    rule = {} if remask_rule == "confidence" else {"remask_rule": remask_rule}  # the default stays out of labels
    if remask_delta is not None:
        rule["remask_delta"] = remask_delta
    modes += [{"mode": "remask", "threshold": t, **rule} for t in thresholds]
    modes += [{"mode": "speculative", "mrp_draft_tokens": draft_tokens}, {"mode": "direct", "mrp_draft_tokens": direct_tokens}]
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


def summarize_targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The project's targets, read off one run: see docs/benchmarks.md."""
    static = rows[0]
    out: dict[str, Any] = {}
    spec = [r for r in rows if r["mode"] == "speculative"]
    if spec:
        r = spec[0]
        out["speculative"] = {
            "identical_to_static": r["identical_to_static"], "tokens_per_forward": r["tokens_per_forward"],
            "speedup_vs_static": r["speedup_vs_static"],
        }
    if static["accuracy"] is None:
        return out
    remask_report = []
    for r in rows:
        if r["mode"] != "dynamic":
            continue
        twin = next((x for x in rows if x["mode"] == "remask" and x["threshold"] == r["threshold"]), None)
        if twin is None:
            continue
        lost = static["accuracy"] - r["accuracy"]
        recovered = (twin["accuracy"] - r["accuracy"]) / lost if lost > 0 else None
        remask_report.append({
            "threshold": r["threshold"], "static_accuracy": static["accuracy"], "dynamic_accuracy": r["accuracy"],
            "remask_accuracy": twin["accuracy"], "points_lost_by_dynamic": 100 * lost,
            "share_recovered": recovered,
            "wall_vs_dynamic": twin["wall_seconds"] / r["wall_seconds"] if r["wall_seconds"] else None,
            "tokens_per_forward_dynamic": r["tokens_per_forward"], "tokens_per_forward_remask": twin["tokens_per_forward"],
        })
    out["remask"] = remask_report
    return out


def format_targets(targets: dict[str, Any]) -> str:
    lines = []
    spec = targets.get("speculative")
    if spec:
        lines.append(
            f"speculative: identical to static: {spec['identical_to_static']}; tokens/forward "
            f"{spec['tokens_per_forward']:.2f} (target >= 2.0); speed-up {spec['speedup_vs_static']:.2f}x (target >= 1.5x)"
        )
    for r in targets.get("remask", []):
        share = "-" if r["share_recovered"] is None else f"{100 * r['share_recovered']:.0f}%"
        lines.append(
            f"remask @ {r['threshold']:g}: dynamic loses {r['points_lost_by_dynamic']:.1f} points; remask recovers "
            f"{share} of them (target >= 60% where dynamic loses >= 20), at {r['wall_vs_dynamic']:.2f}x dynamic's "
            f"wall-clock (target <= 1.3x)"
        )
    return "\n".join(lines)


def run_demo(
    head: str | None = None,
    backbone: str | None = None,
    prompts_file: str | None = None,
    per_task: int = 30,
    thresholds=DEFAULT_THRESHOLDS,
    draft_tokens: int = 3,
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
    timing_repeats: int = 3,
) -> dict[str, Any]:
    """Run the demo; returns {"rows": [...], "targets": {...}, "table": str}."""
    from ..evaluation.runner import format_table, plot_rows, run_modes, write_json
    from ..modeling_mrp import MRPModel, _base_model_location
    from .tasks import ANSWER_LENGTH, held_out_items

    # 1. backbone and head
    if head is None:
        model, tokenizer = bundled.load_reference(with_head=True)
    else:
        from transformers import AutoTokenizer

        from ..backbones import load_backbone

        backbone_model = load_backbone(backbone, trust_remote_code=trust_remote_code) if backbone else None
        model = MRPModel.from_pretrained(head, backbone=backbone_model, trust_remote_code=trust_remote_code)
        source = backbone or _base_model_location(model.head.config.base_model_name_or_path, head)
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
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
        plot_rows(rows, plot_path)
    return {"rows": rows, "targets": targets, "table": format_table(rows) + "\n\n" + format_targets(targets)}
