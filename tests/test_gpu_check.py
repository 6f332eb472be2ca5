"""benchmarks/gpu_check.sh (issue 15): the GPU script's measuring code on tiny shapes on the CPU, and (slow) the
whole script's `--device cpu` dry run, which must print one JSON document."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_gpu_check_measures_every_ratio_on_tiny_shapes(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_check

    result = gpu_check.main(["--device", "cpu", "--prompt-len", "12", "--new-tokens", "8", "--repeats", "1",
                             "--batches", "1,3"])
    assert result["model"] == "random tiny SDAR-shaped" and [run["batch"] for run in result["runs"]] == [1, 3]
    for run in result["runs"]:
        assert set(run["ms"]) == {"backbone", "verify_packed", "verify_stacked", "head_step"}
        assert all(value > 0 for value in run["ms"].values())
        assert run["head_step_over_backbone"] > 0 and run["verify_packed_over_backbone"] > 0
        assert set(run["engine"]) == {"static", "speculative"}
        assert run["engine"]["static"]["backbone_forwards"] == 8  # 8 new tokens, one per step, EOS off


@pytest.mark.slow
def test_gpu_check_script_dry_run_prints_one_json_document(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_OUT": str(tmp_path), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", str(BENCHMARKS / "gpu_check.sh"), "--device", "cpu"], capture_output=True,
                          text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    document = json.loads(done.stdout)
    assert {"demo", "costs"} <= set(document)
    assert document["demo"]["rows"][0]["mode"] == "static" and document["costs"]["runs"]
    assert (tmp_path / "demo" / "plot.png").is_file()
