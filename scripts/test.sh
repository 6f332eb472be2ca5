#!/usr/bin/env bash
# Installs mrp-hf into two fresh virtualenvs (newest transformers 5.x and transformers 4.57.x), runs ruff,
# then the test suite under both. Used by CI (.ci/run) and by developers: `bash scripts/test.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENVS=${MRP_TEST_VENVS:-.ci-venvs}
# CPU machines: keep torch on the CPU wheel (constraints/cpu.txt); set MRP_TORCH_CONSTRAINTS= to skip it.
CONSTRAINTS=${MRP_TORCH_CONSTRAINTS-constraints/cpu.txt}
declare -A TRANSFORMERS=([tf5]="transformers>=5,<6" [tf4]="transformers==4.57.6")

for name in tf5 tf4; do
  venv="$VENVS/$name"
  if [ ! -x "$venv/bin/python" ]; then
    "$PYTHON" -m venv "$venv"
  fi
  pip_args=(-q --disable-pip-version-check)
  [ -n "$CONSTRAINTS" ] && pip_args+=(-c "$CONSTRAINTS")
  if ! "$venv/bin/pip" install "${pip_args[@]}" -e ".[dev,eval]" "${TRANSFORMERS[$name]}" >"$venv/pip.log" 2>&1; then
    cat "$venv/pip.log"; exit 1
  fi
  "$venv/bin/python" -c "import torch, transformers; print('$name: torch', torch.__version__, 'transformers', transformers.__version__)"
done

"$VENVS/tf5/bin/ruff" check .

status=0
for name in tf5 tf4; do
  echo "== tests under $name =="
  # pytest exits 5 when it collected no test: that must fail CI, and it does (non-zero)
  "$VENVS/$name/bin/python" -m pytest -q -p no:cacheprovider "$@" || status=$?
done
exit $status
