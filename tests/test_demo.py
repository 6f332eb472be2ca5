"""The bundled reference DLM + head: they load offline, reproduce their documented static accuracy, and
`mrp-hf demo --json` reports every mode with speculative identical to static."""

import json

import pytest
import torch

from mrp_hf.cli import main
from mrp_hf.reference import bundled, held_out_items
from mrp_hf.reference.train import evaluate_static

REQUIRED_KEYS = {"mode", "threshold", "accuracy", "backbone_forwards", "tokens_per_forward", "wall_seconds",
                 "speedup_vs_static"}


@pytest.fixture(scope="module")
def reference():
    return bundled.load_reference(with_head=True)


def test_bundled_checkpoints_are_small_safetensors():
    for path in (bundled.backbone_path(), bundled.head_path()):
        files = {p.name for p in path.iterdir()}
        assert "model.safetensors" in files and not any(f.endswith((".bin", ".pt", ".pkl")) for f in files)
    size = sum(p.stat().st_size for p in bundled.CHECKPOINTS.rglob("*") if p.is_file())
    assert size <= 25 * 2**20


def test_bundled_backbone_reproduces_its_documented_static_accuracy(reference):
    model, tokenizer = reference
    info = json.loads((bundled.backbone_path() / "training_info.json").read_text())
    items = held_out_items(per_task=info["eval_per_task"], seed=info["seed"] + 1)
    accuracy, per_task = evaluate_static(model.backbone, tokenizer, items)
    model.backbone.eval()
    assert abs(accuracy - info["held_out_static_accuracy"]) <= 1.5 / len(items)  # the same run, to one item


def test_demo_json_on_a_small_subset(tmp_path):
    out = tmp_path / "rows.json"
    assert main(["demo", "--per-task", "2", "--thresholds", "0.5", "--draft-tokens", "2,4", "--json", str(out),
                 "--no-progress", "--timing-repeats", "1", "--plot", str(tmp_path / "plot.png")]) == 0
    rows = json.loads(out.read_text())
    # static, dynamic, remask, K=2, K=4, the draft graphs (a head tree, a head-free chain, a head-free tree over
    # dynamic@0.5: the sweep's one threshold)
    assert [r["mode"] for r in rows] == ["static", "dynamic", "remask", *["speculative"] * 5, "direct"]
    assert [r["mrp_draft_tokens"] for r in rows[3:5]] == [2, 4]
    assert all(REQUIRED_KEYS | {"draft_graph", "base", "identical_to_base"} <= set(r) for r in rows)
    for speculative in rows[3:5]:
        assert speculative["identical_to_static"] is True and speculative["accuracy"] == rows[0]["accuracy"]
        assert speculative["tokens_per_forward"] > 1.0 and speculative["draft_graph"] is None
    graphs = rows[5:8]
    assert [g["draft_graph"] for g in graphs] == ["tree-3x2x1", "chain-7", "tree-3x2x1"]
    assert [g["base"] for g in graphs] == ["static", "static", "dynamic"]
    assert all(g["identical_to_base"] is True for g in graphs)  # lossless against the decoding each builds on
    assert graphs[2]["threshold"] == 0.5 and graphs[1]["drafter"] == "backbone"
    assert rows[1]["base"] == "dynamic" and rows[1]["identical_to_base"] is True
    assert (tmp_path / "plot.png").stat().st_size > 0


def test_demo_sweeps_six_thresholds_and_three_draft_counts_by_default():
    from mrp_hf.reference.demo import demo_modes

    labels = [(m["mode"], m.get("threshold", m.get("mrp_draft_tokens"))) for m in demo_modes()]
    assert labels[0] == ("static", None) and labels[-1] == ("direct", 2)
    assert [t for mode, t in labels if mode == "dynamic"] == [0.95, 0.9, 0.8, 0.7, 0.5, 0.3]
    assert [t for mode, t in labels if mode == "remask"] == [0.95, 0.9, 0.8, 0.7, 0.5, 0.3]
    # then the graphs: two over static, one over dynamic decoding at each threshold
    assert [k for mode, k in labels if mode == "speculative"] == [2, 3, 4, None, None, 0.95, 0.9, 0.8, 0.7, 0.5, 0.3]


def test_speculative_is_identical_to_static_on_a_demo_subset(reference):
    """Lossless: speculative decoding at K = 2, 3, 4 gives static decoding's tokens on every prompt, one at a time
    (the demo's batch 1) and batched."""
    model, tokenizer = reference
    tokenizer.padding_side = "left"
    prompts = [item.prompt for item in held_out_items(per_task=3, seed=7)]
    for size in (1, len(prompts)):
        for start in range(0, len(prompts), size):
            batch = tokenizer(prompts[start : start + size], return_tensors="pt", padding=True, add_special_tokens=False)
            static = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"])
            for k in (2, 3, 4):
                out = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], mrp_mode="speculative",
                                     mrp_draft_tokens=k)
                assert torch.equal(out, static), (prompts[start : start + size], k)


def test_static_accuracy_on_a_fixed_sample(reference):
    """Static decoding (one token per step) on a fixed sample of held-out prompts (a seed other than the one
    training_info.json reports). The shipped model solves sort, perm and swap and gets most of pair's sums right:
    90% on the demo's 100 prompts, 87.5% on these 40 (docs/benchmarks.md); these floors are what it reaches."""
    model, tokenizer = reference
    accuracy, per_task = evaluate_static(model.backbone, tokenizer, held_out_items(per_task=10, seed=99))
    model.backbone.eval()
    assert per_task["sort"] >= 0.9 and per_task["perm"] >= 0.9 and per_task["swap"] >= 0.9, per_task
    assert per_task["pair"] >= 0.5 and accuracy >= 0.85, per_task


def test_table_explains_its_columns_and_nothing_to_recover():
    from mrp_hf.evaluation.runner import format_table
    from mrp_hf.reference.demo import format_targets, summarize_targets

    def row(mode, accuracy, seconds, threshold=None, k=None):
        return {"mode": mode, "threshold": threshold, "mrp_draft_tokens": k, "label": mode, "accuracy": accuracy,
                "n": 4, "backbone_forwards": 10, "head_forwards": 0, "tokens_per_forward": 2.0, "wall_seconds": seconds,
                "speedup_vs_static": 4.0 / seconds, "identical_to_static": mode == "static"}

    rows = [row("static", 1.0, 4.0), row("dynamic", 1.0, 2.0, 0.9), row("remask", 1.0, 2.5, 0.9),
            row("dynamic", 0.5, 1.0, 0.3), row("remask", 0.8, 1.6, 0.3)]
    table = format_table(rows)
    assert "TPF = answer tokens per backbone forward" in table and "x static = static's wall-clock" in table
    text = format_targets(summarize_targets(rows))
    assert "remask @ 0.9: dynamic loses 0.0 points; nothing to recover" in text
    assert "remask recovers 60% of them" in text  # at 0.3: (0.8 - 0.5) / (1.0 - 0.5)
    # remask@0.3 (2.5x) against dynamic@0.3 (4x, 50%): +30 points; remask@0.9 (1.6x) against dynamic@0.9 (2x): +0
    frontier = summarize_targets(rows)["frontier"]
    assert [p["margin_points"] for p in frontier["remask"]] == pytest.approx([0.0, 30.0]) and frontier["met"]
    assert [p["best_dynamic_at_least_as_fast"] for p in frontier["remask"]] == ["dynamic", "dynamic"]


def test_bundled_head_finds_its_backbone_by_relative_path():
    from mrp_hf import MRPModel

    model = MRPModel.from_pretrained(str(bundled.head_path()))  # config: base_model_name_or_path "../backbone"
    assert model.adapter.family == "mrp_reference" and model.head is not None


def test_demo_with_a_head_and_a_prompts_file(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "perm:abc"}\n{"prompt": "sort:dcba"}\n')
    out = tmp_path / "rows.json"
    assert main(["demo", "--head", str(bundled.head_path()), "--prompts", str(prompts), "--thresholds", "0.3",
                 "--json", str(out), "--no-progress"]) == 0
    rows = json.loads(out.read_text())
    assert rows[0]["accuracy"] is None  # no checker for a free prompts file
    assert next(r for r in rows if r["mode"] == "speculative")["identical_to_static"] is True
