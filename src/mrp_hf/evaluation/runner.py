"""Run several decoding modes on the same prompts and report accuracy next to speed.

    rows = run_modes(model, tokenizer, task, ["static", "dynamic:0.9", "speculative:3"], output_dir="out")
    print(format_table(rows)); write_json(rows, "out/rows.json"); plot_rows(rows, "out/plot.png")

A mode is a dict: {"mode": "static"}, {"mode": "dynamic", "threshold": 0.5}, {"mode": "remask",
"threshold": 0.5}, {"mode": "speculative", "mrp_draft_tokens": 3}, {"mode": "direct", "mrp_draft_tokens": 2}
(or the string forms "static", "dynamic:0.5", "remask:0.5", "speculative:3", "direct:2"); a draft graph is
{"mode": "speculative", "mrp_draft_graph": "tree-2x2"} or "speculative:tree-2x2", with "mrp_drafter":
"backbone" for head-free drafts and a "threshold" to speculate over dynamic decoding. Static decoding
always runs, first, and is the reference of `speed-up` and `identical_to_static`.

Resuming: with `output_dir`, each finished batch appends one JSON line per item to `results.jsonl` (mode,
settings, item id, completion, tokens, per-row stats, the batch's wall-clock and forwards, correctness).
A rerun with the same settings skips items already there. Wall-clock sums the recorded per-batch times, so
a resumed run adds times measured in different sessions (and possibly with different batch compositions);
rows report `timing_sessions` so that this is visible.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..generation.modes import MODE_NAMES, regime_error
from ..generation.modes import MODES as MODES_REGISTRY
from .tasks import EvalTask, as_task

logger = logging.getLogger(__name__)

# the evaluation's mode labels: the backbone's own "static" and "dynamic" decoding, then every MRP mode of the
# registry (generation/modes.py), which also says each one's regime
MODES = ("static", "dynamic", *(name for name in MODE_NAMES if name != "off"))
RESULTS_FILE = "results.jsonl"
ROW_KEYS = (
    "mode", "threshold", "mrp_draft_tokens", "accuracy", "n", "backbone_forwards", "head_forwards",
    "tokens_per_forward", "wall_seconds", "speedup_vs_static", "identical_to_static",
    "draft_graph", "base", "identical_to_base",
)


# ----------------------------------------------------------------------------------------------- modes
def parse_mode(spec: str | dict[str, Any]) -> dict[str, Any]:
    """"dynamic:0.9" -> {"mode": "dynamic", "threshold": 0.9}; a dict is checked and returned normalised."""
    if isinstance(spec, str):
        name, _, value = spec.strip().partition(":")
        spec = {"mode": name}
        if value:
            dynamic = name == "dynamic" or (name in MODE_NAMES and MODES_REGISTRY[name].regime == "dynamic")
            key = "threshold" if dynamic else "mrp_draft_tokens" if value.strip().isdigit() else "mrp_draft_graph"
            spec[key] = float(value) if key == "threshold" else int(value) if key == "mrp_draft_tokens" else value
    mode = dict(spec)
    name = mode.get("mode")
    if name not in MODES:
        raise ValueError(f"unknown mode {name!r}; use one of {', '.join(MODES)} (e.g. 'dynamic:0.9', 'speculative:3')")
    if name == "dynamic" and mode.get("threshold") is None:
        raise ValueError(f"mode {name!r} needs a threshold, e.g. '{name}:0.5'")
    if name == "static" and mode.get("threshold") is not None:
        raise ValueError(f"mode {name!r} decodes one token per backbone pick: drop threshold={mode['threshold']}")
    over_dynamic = name in MODE_NAMES and MODES_REGISTRY[name].graph_over_dynamic and mode.get("mrp_draft_graph")
    if name in MODE_NAMES and not over_dynamic:
        problem = regime_error(name, mode.get("threshold"))
        if problem:
            raise ValueError(problem)
        if MODES_REGISTRY[name].regime == "static":
            mode.setdefault("mrp_draft_tokens", 3)
    return mode


def parse_modes(specs: str | Sequence[str | dict[str, Any]]) -> list[dict[str, Any]]:
    """A comma-separated string or a list; static is added when missing and always comes first."""
    if isinstance(specs, str):
        specs = [s for s in specs.split(",") if s.strip()]
    modes = [parse_mode(s) for s in specs]
    statics = [m for m in modes if m["mode"] == "static"]
    others = [m for m in modes if m["mode"] != "static"]
    return [statics[0] if statics else {"mode": "static"}, *others]


def _graph_name(graph: str | Sequence[int]) -> str:
    """A draft graph as written in labels and rows: its shape name, or its branchings joined by "x" ("3x2x1")."""
    return graph if isinstance(graph, str) else "x".join(map(str, graph))


def mode_label(mode: dict[str, Any]) -> str:
    """"static", "dynamic:0.9", "speculative:3", "speculative:tree-2x2", plus any extra generate kwargs."""
    label = mode["mode"]
    if mode.get("threshold") is not None:
        label += f":{mode['threshold']:g}"
    elif mode.get("mrp_draft_tokens") is not None:
        label += f":{mode['mrp_draft_tokens']}"
    graph = mode.get("mrp_draft_graph")
    if graph is not None:  # "speculative:tree-2x2", "speculative:0.5:3x2x1"
        label += f":{_graph_name(graph)}"
    extra = {k: v for k, v in mode.items() if k not in ("mode", "threshold", "mrp_draft_tokens", "mrp_draft_graph")}
    return label + (json.dumps(extra, sort_keys=True) if extra else "")


def mode_generate_kwargs(mode: dict[str, Any]) -> dict[str, Any]:
    """The `MRPModel.generate` keywords of a mode. static: one token per step; dynamic: threshold; the
    MRP modes: `mrp_mode` of the same name. Extra keys of the dict (e.g. remask_rule) pass through."""
    name = mode["mode"]
    kwargs = {k: v for k, v in mode.items() if k not in ("mode",) and v is not None}
    if name == "static":
        kwargs.update(mrp_mode="off", tokens_per_step=kwargs.get("tokens_per_step", 1))
    elif name == "dynamic":
        kwargs.update(mrp_mode="off")
    else:
        kwargs.update(mrp_mode=name)
    return kwargs


# ----------------------------------------------------------------------------------------- results file
def _settings_key(mode: dict[str, Any], common: dict[str, Any]) -> str:
    """Resume key of a configuration: a record is reused only when everything that shapes its output matches."""
    return json.dumps({"mode": mode, "generate": common}, sort_keys=True, default=str)


def load_results(path: str | Path) -> list[dict[str, Any]]:
    """The records of a results file; a torn last line (an interrupted write) is skipped with a warning."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                logger.warning("%s:%d: skipping an unreadable line (interrupted write?)", path, number)
    return records


def _append(path: Path, records: list[dict[str, Any]]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


# ------------------------------------------------------------------------------------------------ run
def _answer_tokens(row: list[int], eos_token_id: int | None) -> list[int]:
    """The answer up to and including its first EOS (what follows is padding)."""
    if eos_token_id is not None and eos_token_id in row:
        return row[: row.index(eos_token_id) + 1]
    return row


def _lengths(**lengths: int | None) -> dict[str, int]:
    """The lengths that are set: unset ones are the model's own (its generation_config.json), which an explicit
    None would reset."""
    return {name: value for name, value in lengths.items() if value is not None}


def run_modes(
    model: Any,
    tokenizer: Any,
    task_or_items: EvalTask | Sequence[Any],
    modes: str | Sequence[str | dict[str, Any]],
    *,
    batch_size: int = 8,
    max_new_tokens: int | None = None,
    block_length: int | None = None,
    generate_kwargs: dict[str, Any] | None = None,
    output_dir: str | Path | None = None,
    chat: bool | None = None,
    limit: int | None = None,
    warmup: bool = True,
    progress: bool = True,
    on_batch: Callable[[dict[str, Any], list[dict[str, Any]]], None] | None = None,
    timing_repeats: int = 1,
) -> list[dict[str, Any]]:
    """Decode every item with every mode (static first) and return one summary row per mode.

    Args:
        model: an `MRPModel` (with a head for the MRP modes).
        tokenizer: its tokenizer; prompts are left-padded; EOS/pad ids default to the tokenizer's.
        task_or_items: an `EvalTask`, or a list of items (see `ItemsTask`).
        modes: mode dicts or strings (see `parse_modes`).
        batch_size: prompts per `generate` call.
        max_new_tokens, block_length, generate_kwargs: passed to every `generate` call (e.g. temperature, seed);
            unset lengths come from the model's generation config.
        output_dir: where `results.jsonl` is appended per batch; a rerun resumes from it.
        chat: wrap prompts in the chat template (None: the task's default, if the tokenizer has a template).
        limit: only the first `limit` items.
        warmup: one untimed single-prompt static `generate` before timing (first-call overheads).
        on_batch: called with (mode, records) after each batch is recorded (progress hooks; tests interrupt here).
        timing_repeats: decode each batch this many times and keep the fastest wall-clock (the outputs are
            deterministic for a fixed seed, so only the time differs): the minimum filters out the machine's
            noise, which on a small shared CPU can exceed the differences being measured.

    Returns:
        rows: `ROW_KEYS` plus `label`, `token_agreement_with_static`, `accepted_drafts`, `revoked_reveals`,
        `resumed_items`, `timing_sessions`.
    """
    from tqdm.auto import tqdm

    task = as_task(task_or_items)
    items = list(task.items())[: limit if limit is not None else None]
    if task.has_checker:
        task.check_ready()  # e.g. no sandbox for generated code: fail now, not after hours of decoding
    ids = [str(item.id) for item in items]
    if len(set(ids)) != len(ids):
        raise ValueError(f"task {task.name!r} has duplicate item ids; resuming needs unique ids")
    modes = parse_modes(modes)
    if getattr(model, "head", None) is None:
        needing = [mode_label(m) for m in modes if m["mode"] in ("remask", "speculative", "direct")]
        if needing:
            raise ValueError(f"modes {needing} need an MRP head; load one with MRPModel.from_pretrained(head) "
                             "(CLI: --head PATH) or run only static/dynamic modes.")

    if getattr(tokenizer, "pad_token_id", None) is None:
        tokenizer.pad_token = tokenizer.eos_token
    common: dict[str, Any] = _lengths(max_new_tokens=max_new_tokens, block_length=block_length)
    common.update(generate_kwargs or {})
    common.setdefault("eos_token_id", tokenizer.eos_token_id)
    common.setdefault("pad_token_id", tokenizer.pad_token_id)
    eos = common["eos_token_id"]
    use_chat = task.chat if chat is None else chat
    prompts = {str(item.id): task.format_prompt(item, tokenizer, chat=use_chat) for item in items}

    path = None
    done: dict[tuple[str, str], dict[str, Any]] = {}
    if output_dir is not None:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        path = Path(output_dir) / RESULTS_FILE
        for record in load_results(path):
            done[(record["settings"], record["item_id"])] = record
    session = uuid.uuid4().hex[:12]

    keys = {mode_label(m): _settings_key(m, common) for m in modes}
    pending = {mode_label(m): [i for i in ids if (keys[mode_label(m)], i) not in done] for m in modes}
    total = sum(len(v) for v in pending.values())
    resumed = len(ids) * len(modes) - total
    if resumed:
        logger.info("resuming: %d of %d (mode, item) results are already in %s", resumed, len(ids) * len(modes), path)

    by_id = {str(item.id): item for item in items}
    results: dict[str, dict[str, dict[str, Any]]] = {label: {} for label in keys}
    for label, settings in keys.items():
        for i in ids:
            if (settings, i) in done:
                results[label][i] = done[(settings, i)]

    padding_side = getattr(tokenizer, "padding_side", "left")
    tokenizer.padding_side = "left"
    try:
        if warmup and total:
            first = next(i for m in modes for i in pending[mode_label(m)])
            _generate(model, tokenizer, [prompts[first]], use_chat, {**common, **mode_generate_kwargs(modes[0])})
        with tqdm(total=total, desc=f"eval {task.name}", unit="item", disable=not progress) as bar:
            # batches outside, modes inside: every mode decodes a batch back to back with the others, so a
            # change in machine load over the run shifts all modes alike instead of biasing their ratios
            for start in range(0, len(ids), batch_size):
                window = ids[start : start + batch_size]
                for mode in modes:
                    label, settings = mode_label(mode), keys[mode_label(mode)]
                    batch_ids = [i for i in window if (settings, i) not in done]
                    if not batch_ids:
                        continue
                    kwargs = {**common, **mode_generate_kwargs(mode)}
                    bar.set_postfix_str(label)
                    records = _run_batch(model, tokenizer, task, [by_id[i] for i in batch_ids],
                                         [prompts[i] for i in batch_ids], use_chat, kwargs, eos, timing_repeats)
                    for record in records:
                        record.update(settings=settings, label=label, mode=mode, session=session)
                        results[label][record["item_id"]] = record
                    if path is not None:
                        _append(path, records)
                    bar.update(len(batch_ids))
                    if on_batch is not None:
                        on_batch(mode, records)
    finally:
        tokenizer.padding_side = padding_side
    return _summarise(modes, ids, results, task.has_checker, session)


def _generate(model: Any, tokenizer: Any, prompts: list[str], chat: bool, kwargs: dict[str, Any]):
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=not chat)
    out = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], return_dict_in_generate=True,
                         **kwargs)
    return batch, out


def _run_batch(model, tokenizer, task, items, prompts, chat, kwargs, eos, repeats: int = 1) -> list[dict[str, Any]]:
    seconds = float("inf")
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        batch, out = _generate(model, tokenizer, prompts, chat, kwargs)
        seconds = min(seconds, time.perf_counter() - start)
    width = batch["input_ids"].shape[1]
    stats = out.stats
    answers = [_answer_tokens(row, eos) for row in out.sequences[:, width:].tolist()]
    completions = tokenizer.batch_decode(answers, skip_special_tokens=True)
    scores = task.score_many(items, completions) if task.has_checker else [{} for _ in items]
    batch_info = {
        "id": uuid.uuid4().hex[:12], "seconds": seconds, "size": len(items),
        "backbone_forwards": stats.backbone_forwards, "head_forwards": stats.head_forwards,
        "accepted_drafts": stats.accepted_drafts, "revoked_reveals": stats.revoked_reveals,
    }
    tpf = stats.tokens_per_forward
    return [
        {
            "item_id": str(item.id),
            "completion": completion,
            "tokens": tokens,
            "correct": score.get("correct") if task.has_checker else None,
            "score": {k: v for k, v in score.items() if k != "correct"},
            "row_backbone_forwards": stats.row_backbone_forwards[i],
            "row_new_tokens": stats.row_new_tokens[i],
            "tokens_per_forward": tpf[i],
            "batch": batch_info,
        }
        for i, (item, completion, tokens, score) in enumerate(zip(items, completions, answers, scores, strict=True))
    ]


def _against_base(mode: dict[str, Any], records: list[dict[str, Any]], results) -> dict[str, Any]:
    """`draft_graph` (its shape, or None), `drafter`, `base` (the decoding a mode builds on: "dynamic" at the
    mode's threshold when it has one, else "static") and `identical_to_base` (every answer token-for-token equal to
    that base's, None when the base did not run in the same sweep)."""
    graph = mode.get("mrp_draft_graph")
    base = "dynamic" if mode.get("threshold") is not None else "static"
    reference = results.get("static" if base == "static" else mode_label({"mode": "dynamic", "threshold": mode["threshold"]}))
    same = None
    if reference is not None:
        pairs = [r["tokens"] == reference[r["item_id"]]["tokens"] for r in records if r["item_id"] in reference]
        same = bool(pairs) and all(pairs)
    return {"draft_graph": None if graph is None else _graph_name(graph),
            "drafter": mode.get("mrp_drafter"), "base": base, "identical_to_base": same}


def _summarise(modes, ids, results, has_checker, session) -> list[dict[str, Any]]:
    rows = []
    static = results[mode_label(modes[0])]
    for mode in modes:
        label = mode_label(mode)
        records = [results[label][i] for i in ids if i in results[label]]
        batches = {r["batch"]["id"]: r["batch"] for r in records}
        wall = sum(b["seconds"] for b in batches.values())
        same = [r["tokens"] == static[r["item_id"]]["tokens"] for r in records if r["item_id"] in static]
        agree, count = 0, 0
        for r in records:
            ref = static.get(r["item_id"], {}).get("tokens")
            if ref is not None:
                n = max(len(ref), len(r["tokens"]))
                agree += sum(a == b for a, b in zip(ref, r["tokens"], strict=False))
                count += n
        correct = [r["correct"] for r in records if r.get("correct") is not None]
        rows.append({
            "mode": mode["mode"],
            "threshold": mode.get("threshold"),
            "mrp_draft_tokens": mode.get("mrp_draft_tokens"),
            "label": label,
            "accuracy": (sum(correct) / len(correct)) if has_checker and correct else None,
            "n": len(records),
            "backbone_forwards": sum(b["backbone_forwards"] for b in batches.values()),
            "head_forwards": sum(b["head_forwards"] for b in batches.values()),
            # the engine's convention: the mean over rows of tokens / forwards that row needed
            "tokens_per_forward": sum(r["tokens_per_forward"] for r in records) / len(records) if records else 0.0,
            "wall_seconds": wall,
            "speedup_vs_static": None,
            "identical_to_static": bool(same) and all(same),
            **_against_base(mode, records, results),
            "token_agreement_with_static": agree / count if count else None,
            "accepted_drafts": sum(b.get("accepted_drafts", 0) for b in batches.values()),
            "revoked_reveals": sum(b.get("revoked_reveals", 0) for b in batches.values()),
            "resumed_items": sum(r.get("session") != session for r in records),
            "timing_sessions": len({r.get("session") for r in records}),
        })
    static_wall = rows[0]["wall_seconds"]
    for row in rows:
        row["speedup_vs_static"] = static_wall / row["wall_seconds"] if row["wall_seconds"] else None
    return rows


# ------------------------------------------------------------------------------------------- reporting
def write_json(rows: list[dict[str, Any]], path: str | Path, **metadata: Any) -> None:
    """`{"rows": rows, **metadata}` as indented JSON."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({**metadata, "rows": rows}, indent=2, default=str) + "\n", encoding="utf-8")


def format_table(rows: list[dict[str, Any]]) -> str:
    """A fixed-width table of the rows (one line per mode)."""
    width = max([16, *(len(r.get("label", r["mode"])) + 2 for r in rows)])
    header = (f"{'mode':<{width}}{'acc':>7}{'n':>6}{'fwd':>8}{'head':>7}{'TPF':>7}{'sec':>9}{'x static':>10}"
              f"{'= static':>10}{'= base':>8}")
    lines = [header, "-" * len(header)]
    for r in rows:
        acc = "-" if r["accuracy"] is None else f"{r['accuracy']:.3f}"
        speed = "-" if r["speedup_vs_static"] is None else f"{r['speedup_vs_static']:.2f}"
        base = "-" if r.get("identical_to_base") is None else str(r["identical_to_base"])
        lines.append(
            f"{r.get('label', r['mode']):<{width}}{acc:>7}{r['n']:>6}{r['backbone_forwards']:>8}{r['head_forwards']:>7}"
            f"{r['tokens_per_forward']:>7.2f}{r['wall_seconds']:>9.2f}{speed:>10}{str(r['identical_to_static']):>10}"
            f"{base:>8}"
        )
    if any(r.get("timing_sessions", 1) > 1 for r in rows):
        lines.append("note: some rows add wall-clock measured in more than one session (resumed run)")
    return "\n".join(lines + ["", TABLE_LEGEND])


#: what format_table's columns mean (printed under the table)
TABLE_LEGEND = """\
columns: acc = share of answers the task's checker accepts ("-": no checker); n = prompts; fwd = backbone
forwards (verify forwards included); head = head forwards; TPF = answer tokens per backbone forward (mean over
prompts); sec = wall-clock of all batches; x static = static's wall-clock / this mode's (above 1: faster);
= static = every answer token-for-token equal to static decoding's; = base = equal to the decoding the mode builds
on (dynamic decoding at the row's threshold when it has one, else static; "-": that base was not run).
speculative:tree-2x2 and the like are draft graphs; {"mrp_drafter": "backbone"}: drafted without the head."""


def pareto_frontier(rows: list[dict[str, Any]], metric: str = "accuracy") -> list[dict[str, Any]]:
    """The rows no other row beats on both wall-clock speed-up vs static and `metric` (at least as good on
    both and better on one), fastest first: the settings a user would choose among."""
    points = [r for r in rows if r.get(metric) is not None and r.get("speedup_vs_static") is not None]

    def beaten(r):
        return any(
            o["speedup_vs_static"] >= r["speedup_vs_static"] and o[metric] >= r[metric]
            and (o["speedup_vs_static"] > r["speedup_vs_static"] or o[metric] > r[metric])
            for o in points
        )

    return sorted((r for r in points if not beaten(r)), key=lambda r: -r["speedup_vs_static"])


# the plot: each mode's marker, colour, label offset (points) and layer: hollow dynamic markers above remask's, so
# that neither hides the other where they meet, and static's star above the speculative points (same accuracy)
_PLOT_STYLE = {
    "remask": dict(marker="s", color="tab:orange", offset=(6, -11), size=7, fill=True, zorder=2),
    "dynamic": dict(marker="o", color="tab:blue", offset=(-20, 5), size=6, fill=False, zorder=3),
    "static": dict(marker="*", color="black", offset=(6, 4), size=13, fill=True, zorder=4),
    "speculative": dict(marker="D", color="tab:green", offset=(6, 4), size=6, fill=True, zorder=2),
    "draft graph": dict(marker="P", color="tab:purple", offset=(6, -11), size=8, fill=True, zorder=2),
    "draft graph over dynamic": dict(marker="X", color="tab:brown", offset=(6, 4), size=7, fill=True, zorder=2),
    "direct": dict(marker="^", color="tab:red", offset=(6, 4), size=8, fill=True, zorder=2),
}


def _series(r: dict[str, Any]) -> str:
    """The plot series of a row: its mode, or "draft graph" for speculative decoding with a draft graph ("draft
    graph over dynamic" with a threshold)."""
    if r["mode"] == "speculative" and r.get("draft_graph"):
        return "draft graph over dynamic" if r.get("threshold") is not None else "draft graph"
    return r["mode"]


def _graph_label(r: dict[str, Any]) -> str:
    """A draft-graph row's shape, "no head" when the backbone drafted it."""
    return f"{r.get('draft_graph')}{' no head' if r.get('drafter') == 'backbone' else ''}"


def _point_label(r: dict[str, Any]) -> str:
    if _series(r) == "draft graph":
        return _graph_label(r)
    if _series(r) == "draft graph over dynamic":  # the shape goes to the legend: labels stay short
        return f"{r['threshold']:g}"
    if r["mode"] in ("dynamic", "remask"):
        return f"{r['threshold']:g}"
    if r["mode"] == "speculative":
        return f"K={r['mrp_draft_tokens']}"
    return ""


def _group_close_labels(ax, labels):
    """Labels of one series whose points lie within a few pixels of each other become one label ("0.95/0.9")
    at the first of them: separate labels there could only overlap."""
    groups: list[list[Any]] = []
    for text, x, y, offset, color in labels:
        here = ax.transData.transform((x, y))
        for group in groups:
            if group[4] == color and abs(group[5][0] - here[0]) < 14 and abs(group[5][1] - here[1]) < 14:
                group[0].append(text)
                break
        else:
            groups.append([[text], x, y, offset, color, here])
    for group in groups:  # thresholds from the highest, draft counts from the lowest
        group[0] = "/".join(sorted(group[0], key=lambda t: -float(t) if t.replace(".", "", 1).isdigit() else t))
    return [tuple(group[:5]) for group in groups]


def _place_labels(ax, labels: list[tuple[str, float, float, tuple[int, int], str]]) -> None:
    """Annotate points so that no label meets another label or any marker: each label takes the first of a few
    offsets around its point (its mode's own first) whose box, with a margin, is free (greedy, display
    coordinates)."""
    from matplotlib.transforms import Bbox

    ax.figure.canvas.draw()
    renderer = ax.figure.canvas.get_renderer()
    markers = [ax.transData.transform((x, y)) for line in ax.get_lines() for x, y in line.get_xydata()
               if line.get_marker() not in (None, "None", "") and x == x and y == y]
    taken = [Bbox.from_extents(px - 9, py - 9, px + 9, py + 9) for px, py in markers]  # the frontier's rings too
    for text, x, y, offset, color in _group_close_labels(ax, labels):
        for dx, dy in (offset, (7, 4), (7, -11), (-22, 5), (-22, -11), (-6, 10), (-6, -17), (12, -3), (-30, -3),
                       (7, 14), (7, -21), (-22, 14), (-22, -21)):
            note = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=7, color=color)
            box = note.get_window_extent(renderer)
            if not any(box.expanded(1.1, 1.4).overlaps(other) for other in taken):
                break
            note.remove()
        else:  # every offset is crowded: keep the mode's own
            note = ax.annotate(text, (x, y), textcoords="offset points", xytext=offset, fontsize=7, color=color)
            box = note.get_window_extent(renderer)
        taken.append(box)


def _plot_panel(ax, rows, metric: str, x_key: str, frontier: list[dict[str, Any]] | None) -> None:
    labels = []
    for name, style in _PLOT_STYLE.items():
        line = sorted((r for r in rows if _series(r) == name and r.get(x_key) is not None), key=lambda r: r[x_key])
        if not line:
            continue
        xs, ys = [r[x_key] for r in line], [float("nan") if r.get(metric) is None else r[metric] for r in line]
        if name == "draft graph over dynamic":  # its shapes (drafter) in the legend, its thresholds on the points
            name = f"{name}: " + ", ".join(sorted({_graph_label(r) for r in line}))
        ax.plot(xs, ys, linestyle="-" if name in ("dynamic", "remask") else "none", marker=style["marker"],
                color=style["color"], markersize=style["size"], label=name, alpha=0.9,
                markerfacecolor=style["color"] if style["fill"] else "white", zorder=style["zorder"])
        labels += [(_point_label(r), x, y, style["offset"], style["color"]) for r, x, y in zip(line, xs, ys, strict=True)]
    if frontier:
        xs, ys = [r[x_key] for r in frontier], [r[metric] for r in frontier]
        ax.plot(xs, ys, color="gray", linestyle="--", linewidth=1, zorder=1)
        ax.plot(xs, ys, "o", markersize=13, markerfacecolor="none", markeredgecolor="gray", zorder=1,
                label="Pareto frontier")
    ax.margins(x=0.1, y=0.1)  # room for the labels of the outermost points
    _place_labels(ax, [label for label in labels if label[0]])
    ax.set_ylabel(metric.replace("_", " "))
    ax.grid(alpha=0.3)


def plot_rows(rows: list[dict[str, Any]], path: str | Path, title: str | None = None) -> Path:
    """PNG, two panels with a shared y axis: accuracy (or, without a checker, agreement with static) against
    wall-clock speed-up vs static, with the Pareto frontier marked (the trade-off a user chooses on), and against
    tokens per backbone forward (what the speed-up is made of). Dynamic and remask are lines through their
    thresholds (each labelled); static, speculative (K=...), draft graphs (shape; "no head": drafted by the
    backbone itself), draft graphs over dynamic decoding (their threshold; the shape in the legend) and direct
    are points."""
    import matplotlib

    matplotlib.use("Agg")  # files only: never open a window
    import matplotlib.pyplot as plt

    metric = "accuracy" if any(r["accuracy"] is not None for r in rows) else "token_agreement_with_static"
    fig, (wall, tpf) = plt.subplots(1, 2, figsize=(11, 5.2), sharey=True)
    _plot_panel(wall, rows, metric, "speedup_vs_static", pareto_frontier(rows, metric))
    wall.axvline(1.0, color="black", linewidth=0.6, alpha=0.5)
    wall.set_xlabel("wall-clock speed-up vs static (x)")
    wall.set_title("accuracy vs wall-clock", fontsize=10)
    _plot_panel(tpf, rows, metric, "tokens_per_forward", None)
    tpf.set_xlabel("tokens per backbone forward")
    tpf.set_title("accuracy vs tokens per forward", fontsize=10)
    n = max((r["n"] for r in rows), default=0)
    fig.suptitle(title or f"Decoding modes: {metric.replace('_', ' ')} against speed ({n} prompts)")
    # the legend below the panels, where it can hide no point
    handles, names = wall.get_legend_handles_labels()
    fig.legend(handles, names, fontsize=7, loc="lower center", ncol=min(4, len(names)), frameon=False)
    fig.tight_layout(rect=(0, 0.03 * (1 + (len(names) - 1) // 4), 1, 1))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
