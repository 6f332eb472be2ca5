"""The bundled reference DLM + head: they load offline, reproduce their documented static accuracy, and
`mrp-hf demo --json` reports every mode with speculative identical to static."""

import json

import pytest

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
    assert accuracy >= 0.9
    assert abs(accuracy - info["held_out_static_accuracy"]) <= 1.5 / len(items)  # the same run, to one item


def test_demo_json_on_a_small_subset(tmp_path):
    out = tmp_path / "rows.json"
    assert main(["demo", "--per-task", "2", "--thresholds", "0.5", "--json", str(out), "--no-progress", "--timing-repeats", "1",
                 "--plot", str(tmp_path / "plot.png")]) == 0
    rows = json.loads(out.read_text())
    assert [r["mode"] for r in rows] == ["static", "dynamic", "remask", "speculative", "direct"]
    assert all(REQUIRED_KEYS <= set(r) for r in rows)
    speculative = rows[3]
    assert speculative["identical_to_static"] is True and speculative["accuracy"] == rows[0]["accuracy"]
    assert speculative["tokens_per_forward"] > 1.0
    assert (tmp_path / "plot.png").stat().st_size > 0


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
