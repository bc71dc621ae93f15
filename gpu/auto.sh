#!/usr/bin/env bash
# model.kernel auto on one GPU: (a) the kernel table of this device, measured by
# `python -m ltm.bench.kernels --tune` (ours, fla's Triton path, fla as installed with FlashQLA)
# at the two shapes the model below runs, written to OUT/kernel-table.json; (b) the training
# tokens/s of the GPU profile's DeltaNet (the gated delta rule; head dim 128, where FlashQLA
# applies) at T=2048 and T=8192 with model.kernel triton, fla and auto (auto on the table of (a)),
# as one table (`python -m ltm.bench.auto_train`, OUT/training.json). Everything is tee'd to
# OUT/log. Under 9 minutes on a fresh machine: one shape per class the model runs, fla's
# autotuning and FlashQLA's compilation done once in (a) and kept for (b) through
# TRITON_CACHE_DIR and FLA_CACHE_RESULTS=1.
#
#   bash gpu/grid_references.sh install   # fla-core, flash-qla, tilelang, apache-tvm-ffi,
#                                         # torch-c-dlpack-ext from the wheels in .whl
#   bash gpu/grid_references.sh z3        # z3-solver from .whl2, next, on the same machine
#   OUT=DIR bash gpu/auto.sh              # this script (default OUT gpu/results/auto)
#
# Without the first two steps fla is absent and only ours and auto run (auto then is ours).
# Environment: SITE (the installs' folder, default /tmp/site), SHAPES (the tuned B,T,H,D shapes),
# BUDGET (seconds for the whole script, default 510), TUNE_S (seconds for (a), default 300).
set -uo pipefail
SITE=${SITE:-/tmp/site}
OUT=${OUT:-gpu/results/auto}
SHAPES=${SHAPES:-"8,2048,6,128;2,8192,6,128"}
BUDGET=${BUDGET:-510}
mkdir -p "$OUT"
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1 FLA_CACHE_RESULTS=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
# pyproject maps the package ltm.kernels to kernels/; without an install a link does the same
[ -e ltm/kernels ] || ln -sfn ../kernels ltm/kernels
table=$OUT/kernel-table.json
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c 'import torch, triton, importlib.util as u; print("torch", torch.__version__,
    "triton", triton.__version__, {p: u.find_spec(p) is not None for p in ("fla", "flash_qla", "tilelang")})'
  echo "== (a) kernel table: $SHAPES"
  timeout -k 10 "${TUNE_S:-300}" python3 -m ltm.bench.kernels --tune --ops delta_rule \
    --shapes "$SHAPES" --out "$table" || echo "== tune FAILED or cut (exit $?); its table keeps the rows measured"
  [ -f "$table" ] && export LTM_AUTO_TABLE=$table
  left=$((BUDGET - SECONDS))
  echo "== (b) training tokens/s, kernel table ${LTM_AUTO_TABLE:-shipped}, ${left} s left"
  if ((left >= 60)); then
    timeout -k 10 "$left" python3 -m ltm.bench.auto_train --mixer deltanet --heads 6 \
      --seq-lens 2048 8192 --kernels triton fla auto --out "$OUT/training.json" \
      || echo "== training FAILED or cut (exit $?)"
  else
    echo "== training SKIPPED (out of time)"
  fi
  echo "== done in $SECONDS s"
} 2>&1 | tee "$OUT/log"
