import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from stand_ins import save_stand_in

from mrp_hf.cli import main
from mrp_hf.reference import bundled


def test_families_lists_every_adapter(capsys):
    assert main(["families", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    families = {row["family"] for row in data["supported"]}
    assert {"llada", "dream", "sdar", "fast_dllm_v2", "llada2", "masked_lm", "generic"} <= families
    assert "diffusion_gemma" in data["refused"]


def test_generate_decodes_a_batch_from_a_local_folder(tmp_path, capsys):
    path = save_stand_in("sdar", tmp_path / "sdar")
    code = main([
        "generate", "--backbone", str(path), "--trust-remote-code", "--prompt", "a b c", "--prompt", "d",
        "--max-new-tokens", "8", "--block-length", "4", "--json",
    ])
    assert code == 0
    captured = capsys.readouterr()
    answers = [json.loads(line) for line in captured.out.strip().splitlines()]
    assert [a["prompt"] for a in answers] == ["a b c", "d"]
    stats = json.loads(captured.err.strip().splitlines()[-1])
    assert stats["backbone_forwards"] >= 2 and len(stats["row_new_tokens"]) == 2


# --- a new user's first commands on the bundled model (issue 14): defaults from the model, one-line errors


ROOT = Path(__file__).resolve().parents[1]


def bundled_generation_config():
    from transformers import GenerationConfig

    return GenerationConfig.from_pretrained(bundled.backbone_path())


def _doc_commands(path: Path, prefix: str) -> list[list[str]]:
    """The `mrp-hf ...` lines of a doc's ```bash blocks that start with `prefix` (comments cut)."""
    commands, in_bash = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_bash = line.strip() == "```bash"
            continue
        text = line.split("#")[0].strip() if in_bash else ""
        if text.startswith(prefix):
            commands.append(shlex.split(text)[1:])  # without the program name
    return commands


def test_generate_on_the_bundled_model_takes_its_lengths_from_its_generation_config(capsys):
    assert main(["generate", "--reference", "--prompt", "sort:dcba", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out.strip())["answer"] == "abcd,dcba"  # the reference task: sorted, then reversed
    stats = json.loads(out.err.strip().splitlines()[-1])
    new_tokens = bundled_generation_config().max_new_tokens
    assert new_tokens < 128 and stats["row_new_tokens"][0] <= new_tokens  # the model's own length, not 128
    assert "1 torch thread" in out.err


def test_speculative_from_the_command_line_matches_static(capsys):
    assert main(["generate", "--reference", "--prompt", "sort:hgfe", "--prompt", "sort:lkj", "--json"]) == 0
    static = [json.loads(line)["answer"] for line in capsys.readouterr().out.splitlines()]
    assert main(["generate", "--reference", "--prompt", "sort:hgfe", "--prompt", "sort:lkj", "--json",
                 "--mrp-mode", "speculative"]) == 0
    captured = capsys.readouterr()
    assert [json.loads(line)["answer"] for line in captured.out.splitlines()] == static
    assert json.loads(captured.err.strip().splitlines()[-1])["head_forwards"] > 0


@pytest.mark.parametrize("doc", ["README.md", "docs/quickstart.md"])
def test_the_docs_generate_and_eval_commands_run_as_written(doc, capsys):
    commands = _doc_commands(ROOT / doc, "mrp-hf generate --reference") + _doc_commands(ROOT / doc, "mrp-hf eval --reference")
    assert commands, f"{doc} shows no generate/eval command on the bundled model"
    for argv in commands:
        assert main(argv + ["--no-progress"] * (argv[0] == "eval")) == 0, argv
    assert "static" in capsys.readouterr().out


def test_the_docs_demo_command_runs_on_a_subset(tmp_path, capsys, monkeypatch):
    (argv,) = _doc_commands(ROOT / "docs/quickstart.md", "mrp-hf demo")
    monkeypatch.chdir(tmp_path)  # --output runs/demo lands here
    assert main(argv + ["--per-task", "1", "--timing-repeats", "1", "--no-progress"]) == 0
    out = capsys.readouterr()
    assert "mrp-hf generate --reference" in out.out  # what to try next
    assert "1 torch thread" in out.err
    assert (tmp_path / "runs/demo/rows.json").is_file()


def test_mrp_mode_without_a_head_is_a_usage_error(capsys):
    backbone = str(bundled.backbone_path())
    assert main(["generate", "--backbone", backbone, "--prompt", "sort:ab", "--mrp-mode", "remask"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--mrp-mode remask needs a trained head" in err


def _run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "mrp_hf.cli", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def test_a_missing_folder_is_one_line_without_traceback_and_debug_shows_it():
    result = _run_cli("generate", "--backbone", "./no/such/model", "--prompt", "x")
    assert result.returncode == 1
    assert result.stderr.strip() == "mrp-hf generate: no such folder: ./no/such/model (the backbone to load)"
    debug = _run_cli("generate", "--backbone", "./no/such/model", "--prompt", "x", "--debug")
    assert "Traceback" in debug.stderr and "ModelSourceError" in debug.stderr


def test_an_uncached_hub_id_fails_at_once_when_offline(tmp_path):
    start = time.perf_counter()
    result = _run_cli("eval", "--head", "someone/not-cached-mrp", "--task", "reference",
                      env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path)})
    assert time.perf_counter() - start < 60  # no connection attempt: the interpreter start-up only
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "not in the local cache" in result.stderr and "offline" in result.stderr


def test_an_uncached_hub_id_with_the_hub_unreachable_says_so(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from mrp_hf.backbones.loading import ModelSourceError, check_model_source

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ModelSourceError, match="not in the local cache.*cannot be reached"):
        check_model_source("someone/not-cached", cache_dir=str(tmp_path))


def test_a_cached_hub_id_passes_the_check(tmp_path):
    from mrp_hf.backbones.loading import check_model_source

    snapshot = tmp_path / "models--someone--cached" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--someone--cached" / "refs").mkdir()
    (tmp_path / "models--someone--cached" / "refs" / "main").write_text("a" * 40)
    check_model_source("someone/cached", cache_dir=str(tmp_path))


@pytest.mark.parametrize("command", ["generate", "eval", "demo", "calibrate"])
def test_help_shows_each_options_default(command):
    from mrp_hf.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, type(parser._subparsers._group_actions[0])))
    text = re.sub(r"\s+", "", sub.choices[command].format_help())  # argparse wraps long defaults anywhere
    assert "(default:0)" in text or "(default:1)" in text  # an int default
    for action in sub.choices[command]._actions:
        if action.option_strings and action.dest != "help" and action.default not in (None, [], "==SUPPRESS==") \
                and action.default is not False:
            shown = re.sub(r"\s+", "", f"(default: {action.default})")
            assert shown in text or "default" in (action.help or ""), action.dest
