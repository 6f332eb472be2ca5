#!/usr/bin/env bash
# The GPU check of issue 15, one prepared script (under 8 minutes on a CUDA machine): installs what is missing,
# runs `mrp-hf demo` on the GPU (every mode on the bundled reference DLM + head), measures the costs that decide
# MRP's speed on a random SDAR-1.7B-shaped model in bfloat16 at batch 1 and 16 (benchmarks/gpu_check.py), and
# prints ONE JSON document on stdout: {"demo": {"rows", "targets"}, "costs": {...}}; progress goes to stderr.
#
#   bash benchmarks/gpu_check.sh > gpu_check.json          # on a CUDA machine
#   bash benchmarks/gpu_check.sh --device cpu               # dry run: tiny shapes, a small demo subset (seconds)
#
# PYTHON picks the interpreter (default python3); GPU_CHECK_OUT keeps the demo's folder (plot.png, results).
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=cuda
if [[ "${1:-}" == "--device" ]]; then DEVICE=${2:?--device needs a value}; fi
PY=${PYTHON:-python3}
OUT=${GPU_CHECK_OUT:-$(mktemp -d)}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's code, whatever is installed

# 1. what is missing (a CUDA machine is expected to bring torch with CUDA; pip brings the rest)
if ! "$PY" -c "import torch, transformers, accelerate, peft, safetensors, matplotlib, tqdm" 2>/dev/null; then
  echo "gpu_check: installing the dependencies" >&2
  "$PY" -m pip install -q -e . matplotlib >&2
fi
if [[ "$DEVICE" == cuda* ]] && ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
  echo "gpu_check: torch sees no CUDA device; run with --device cpu for a dry run" >&2
  exit 2
fi

# 2. the demo on the device (one timing pass: the GPU's timings are steady)
if [[ "$DEVICE" == cpu ]]; then DEMO_ARGS=(--per-task 1 --thresholds 0.9,0.5 --draft-tokens 2); else DEMO_ARGS=(); fi
echo "gpu_check: mrp-hf demo on $DEVICE" >&2
"$PY" -m mrp_hf.cli demo --device "$DEVICE" --output "$OUT/demo" --timing-repeats 1 --no-progress \
  "${DEMO_ARGS[@]}" >&2

# 3. the cost ratios on a random SDAR-1.7B-shaped model (tiny shapes on the CPU)
echo "gpu_check: cost ratios on $DEVICE" >&2
if [[ "$DEVICE" == cpu ]]; then COST_ARGS=(--prompt-len 16 --new-tokens 8 --repeats 2); else COST_ARGS=(); fi
"$PY" benchmarks/gpu_check.py --device "$DEVICE" "${COST_ARGS[@]}" > "$OUT/costs.json"

# 4. one JSON document
"$PY" - "$OUT" <<'PYEOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
demo = json.loads((out / "demo" / "rows.json").read_text())
print(json.dumps({"demo": {"targets": demo["targets"], "rows": demo["rows"]},
                  "costs": json.loads((out / "costs.json").read_text()),
                  "demo_folder": str(out / "demo")}, indent=2))
PYEOF
