#!/usr/bin/env bash
# Rebuild the bundled reference DLM and its MRP head (src/mrp_hf/reference/checkpoints/), seeded:
#   1. the backbone, by its own training script, one thread (the core left keeps the pace steady when other work
#      shares the 2-core machine): 3200 steps from scratch (~38 min), then 600 steps from there with a fresh,
#      lower schedule (~7 min), which took `pair` from 40% to 58% on held-out prompts;
#   2. head-training data from the tasks' training split (JSONL);
#   3. the head (1 layer of width 64), by the project's head-training pipeline, `mrp-hf train` (~15 min).
# Usage: bash scripts/build_reference.sh [OUTPUT_DIR]   (default: the package's checkpoints folder)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=${1:-src/mrp_hf/reference/checkpoints}
WORK=${MRP_BUILD_DIR:-$(mktemp -d)}
BACKBONE_STEPS=${BACKBONE_STEPS:-3200}
SECOND_PHASE_STEPS=${SECOND_PHASE_STEPS:-600}
HEAD_STEPS=${HEAD_STEPS:-900}

"$PY" -m mrp_hf.reference.train backbone --output "$WORK/backbone-first" --steps "$BACKBONE_STEPS" --seed 0 --threads 1
"$PY" -m mrp_hf.reference.train backbone --output "$WORK/backbone" --init-from "$WORK/backbone-first" \
  --steps "$SECOND_PHASE_STEPS" --lr 1e-3 --warmup 50 --seed 1 --threads 1 --eval-every 200
"$PY" -m mrp_hf.reference.train head-data --output "$WORK/head-data.jsonl" --samples 48000 --seed 1
"$PY" -m mrp_hf.cli train --backbone "$WORK/backbone" --dataset "$WORK/head-data.jsonl" --output "$WORK/head" \
  --max-length 40 --batch-size 32 --steps "$HEAD_STEPS" --lr 2e-3 --num-layers 1 --head-hidden-size 64 --num-heads 2 \
  --k-steps 2 --reveal-per-block random --reveal-max 4 --reveal-order confidence --eval-fraction 0.01 \
  --eval-every 400 --save-every 400 --seed 0

mkdir -p "$OUT"
rm -rf "$OUT/backbone" "$OUT/head"
cp -r "$WORK/backbone" "$OUT/backbone"
cp -r "$WORK/head" "$OUT/head"
# the bundled head names its backbone by the relative path it ships at
"$PY" - "$OUT/head/config.json" <<'PYEOF'
import json, sys
config = json.load(open(sys.argv[1]))
config["base_model_name_or_path"] = "../backbone"
open(sys.argv[1], "w").write(json.dumps(config, indent=2, sort_keys=True) + "\n")
PYEOF
du -sh "$OUT"/*
