#!/usr/bin/env bash
# GPU check, unattended (see docs/gpu.md): tiny model on vLLM, recording proxy, >= 8 mini-SWE-agent rollouts,
# logprob parity with transformers, one update of the project's trainer and a weight sync into the running vLLM.
# Writes $OUT/gpu_check.json (+ gpu_check.log and the servers' logs); OUT defaults to outputs/gpu_check.
# Extra arguments go to `python -m repro.experiments.bench.gpu_check` (e.g. --server cpu for a dry run without a GPU; --trainer verl
# adds verl's actor on the recorded rows).
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-outputs/gpu_check}"
export OUT
mkdir -p "$OUT"
BUDGET_S="${GPU_CHECK_BUDGET_S:-420}"  # the script's own budget; the hard stop below adds a margin for cleanup

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi

# Python packages carried as wheels in .whl/ (no network on the device machine) go to a private target dir.
if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/repro-site \
    .whl/*.whl || { echo "gpu_check: installing the wheels in .whl/ failed" >&2; exit 2; }
  export PYTHONPATH="/tmp/repro-site${PYTHONPATH:+:$PYTHONPATH}"
fi

export PYTHONUNBUFFERED=1
timeout --kill-after=20 "$((BUDGET_S + 60))" "$PY" -m repro.experiments.bench.gpu_check --out "$OUT" --budget-s "$BUDGET_S" "$@" \
  2>&1 | tee "$OUT/gpu_check.log"
status=${PIPESTATUS[0]}
[ "$status" -eq 124 ] && echo "gpu_check: stopped after $((BUDGET_S + 60)) s; $OUT/gpu_check.json has the steps done" >&2
exit "$status"
