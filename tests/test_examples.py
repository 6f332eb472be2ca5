"""The scripts in examples/ run as the examples' README tells users to run them: `python examples/X.py --tiny`,
on the reference DLM and head bundled with mrp-hf, with no test-only settings.

Each line of the README's ```bash block is run in this process through `runpy` (so torch and transformers are
imported once), with exactly that command line, and must exit cleanly and print its summary line.
"""

from __future__ import annotations

import runpy
import shlex
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def readme_commands() -> dict[str, list[str]]:
    """{script name: its arguments} from the ```bash block of examples/README.md."""
    text = (EXAMPLES / "README.md").read_text()
    block = text.split("```bash", 1)[1].split("```", 1)[0]
    commands = {}
    for line in block.strip().splitlines():
        words = shlex.split(line)
        assert words[:1] == ["python"] and words[1].startswith("examples/"), line
        commands[Path(words[1]).name] = words[2:]
    return commands


COMMANDS = readme_commands()


def run_example(name: str, monkeypatch, capsys, cwd: Path) -> str:
    """Run examples/<name> as __main__ with the README's arguments; return its stdout (fails on a non-zero exit)."""
    monkeypatch.delenv("MRP_EXAMPLES_TINY", raising=False)
    monkeypatch.setattr(sys, "argv", [str(EXAMPLES / name), *COMMANDS[name]])
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.chdir(cwd)
    try:
        runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    except SystemExit as exit_:
        assert exit_.code in (0, None), f"{name} exited with {exit_.code!r}\n{capsys.readouterr().out}"
    return capsys.readouterr().out


def test_the_readme_lists_every_example():
    scripts = {p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_")}
    assert set(COMMANDS) == scripts
    assert all(args == ["--tiny"] for args in COMMANDS.values())


def test_generate_with_head(monkeypatch, capsys, tmp_path):
    out = run_example("generate_with_head.py", monkeypatch, capsys, tmp_path)
    assert "tiny mode: the bundled reference DLM" in out and "1 torch thread" in out
    assert "stats speculative:" in out and "identical to static: True" in out


def test_attach_head(monkeypatch, capsys, tmp_path):
    out = run_example("attach_head.py", monkeypatch, capsys, tmp_path)
    assert "attached head: backbone_forwards=" in out


def test_stream(monkeypatch, capsys, tmp_path):
    out = run_example("stream.py", monkeypatch, capsys, tmp_path)
    assert "streamed " in out and " tokens in " in out


def test_train_head_jsonl(monkeypatch, capsys, tmp_path):
    out = run_example("train_head_jsonl.py", monkeypatch, capsys, tmp_path)
    assert "held-out KL" in out and "the bundled head" in out and "trained head saved to" in out


def test_train_head_lora(monkeypatch, capsys, tmp_path):
    pytest.importorskip("peft")
    out = run_example("train_head_lora.py", monkeypatch, capsys, tmp_path)
    assert "adapter '" in out and "speculative identical to static: True" in out


def test_eval_humaneval(monkeypatch, capsys, tmp_path):
    out = run_example("eval_humaneval.py", monkeypatch, capsys, tmp_path)
    assert "tiny mode: the reference tasks, not HumanEval" in out
    assert "speculative identical to static: True" in out
    assert out.count("\n") >= 8  # the table: header, rule, one line per mode
