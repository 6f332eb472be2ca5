"""Wall-clock of `mrp-hf demo` (its defaults, the thread default included) on a quiet machine and under a concurrent
CPU load: one busy-looping process per core, started before the demo and stopped after it.

    python benchmarks/bench_demo_load.py [--load-only | --quiet-only] [-- extra demo arguments]

Prints one JSON row per condition: wall seconds of the whole command, the demo's thread line, the load processes.
The demo's own table is not repeated here; its figures are ratios measured inside one run (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _spin() -> None:
    while True:  # pure Python: holds one core, touches no shared state
        pass


def run_demo(extra: list[str]) -> dict:
    script = Path(sys.executable).with_name("mrp-hf")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "mrp_hf.cli"]
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        done = subprocess.run([*command, "demo", "--output", folder, "--no-progress", *extra], capture_output=True,
                              text=True, env={k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"})
        seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"mrp-hf demo failed ({done.returncode}):\n{done.stderr[-2000:]}")
    threads = next((line for line in done.stderr.splitlines() if "torch thread" in line), "")
    return {"seconds": round(seconds, 1), "threads": threads.strip()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load-only", action="store_true")
    parser.add_argument("--quiet-only", action="store_true")
    parser.add_argument("extra", nargs="*", help="arguments passed on to mrp-hf demo (after --)")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    if not args.load_only:
        print(json.dumps({"condition": "quiet", "cores": cores, **run_demo(args.extra)}), flush=True)
    if not args.quiet_only:
        spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(cores)]
        for process in spinners:
            process.start()
        try:
            row = run_demo(args.extra)
        finally:
            for process in spinners:
                process.terminate()
        print(json.dumps({"condition": f"{cores} busy-looping processes", "cores": cores, **row}), flush=True)


if __name__ == "__main__":
    main()
