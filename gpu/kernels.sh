#!/usr/bin/env bash
# On a CUDA machine: the kernel tests (same files as CI, on the GPU) and the kernel benchmark.
# Usage: bash gpu/kernels.sh LOG_DIR [benchmark shapes "B,T,H,D;..."]
# GRID=1 runs gpu/kernel_grid.py (the shape grid against fla) instead of ltm.bench.kernels.
# Wheels found in .whl (fla-core for the comparison) are installed into a scratch folder first.
set -o pipefail
LOG_DIR=${1:-gpu/results}
SHAPES=${2:-}
mkdir -p "$LOG_DIR"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/ltm-site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/ltm-site
fi
# pyproject maps the package ltm.kernels to kernels/; without an install a link does the same
[ -e ltm/kernels ] || ln -s ../kernels ltm/kernels
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv \
  | tee "$LOG_DIR/gpu.log"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
  | tee -a "$LOG_DIR/gpu.log"
# one pytest per file, each within TEST_TIMEOUT seconds: a run cut at its limit prints no summary,
# and the whole folder on one GPU takes longer than a 10-minute call
: >"$LOG_DIR/tests.log"
for file in tests/kernels/test_*.py; do
  timeout "${TEST_TIMEOUT:-240}" python3 -m pytest "$file" -q -p no:warnings -rf --durations=3 -n 8 \
    2>&1 | tee -a "$LOG_DIR/tests.log" || echo "== $file: FAILED or cut (exit $?)" | tee -a "$LOG_DIR/tests.log"
done
if [ -n "${GRID:-}" ]; then
  # issue 18's shape grid, ours against fla, few-heads variants and the decode step
  timeout "${BENCH_TIMEOUT:-330}" python3 gpu/kernel_grid.py --out "$LOG_DIR" \
    --budget-s "$(( ${BENCH_TIMEOUT:-330} - 40 ))" 2>&1 | tee "$LOG_DIR/grid.log"
else
  timeout "${BENCH_TIMEOUT:-330}" python3 -m ltm.bench.kernels --out "$LOG_DIR/kernels-gpu.json" \
    ${SHAPES:+--shapes "$SHAPES"} 2>&1 | tee "$LOG_DIR/bench.log"
fi
