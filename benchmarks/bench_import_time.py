"""Start-up cost: `python -c "import mrp_hf"` and `mrp-hf --help` in fresh interpreters (target: each < 1.5 s).

    python benchmarks/bench_import_time.py [--repeats 5]

Prints one JSON row per command: median, min and max wall seconds over the repeats, and, as the baseline of the
same run, `python -c "pass"` (the interpreter's own start-up). Importing mrp_hf must not import torch or
transformers (tests/test_imports.py checks that); this measures what it does cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

# the console script installed beside this interpreter (what a user runs), else the module
_SCRIPT = Path(sys.executable).with_name("mrp-hf")
_CLI = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "mrp_hf.cli"]
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "import mrp_hf": [sys.executable, "-c", "import mrp_hf"],
    "mrp-hf --help": [*_CLI, "--help"],
    "mrp-hf train --help": [*_CLI, "train", "--help"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if not _SCRIPT.exists():
        print(f"note: no mrp-hf script beside {sys.executable}; timing `python -m mrp_hf.cli` instead", file=sys.stderr)
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.repeats):  # interleaved, so that machine load hits every command alike
        for name, command in COMMANDS.items():
            start = time.perf_counter()
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            times[name].append(time.perf_counter() - start)
    for name, samples in times.items():
        print(json.dumps({"command": name, "median_s": round(statistics.median(samples), 3),
                          "min_s": round(min(samples), 3), "max_s": round(max(samples), 3), "repeats": args.repeats}))


if __name__ == "__main__":
    main()
