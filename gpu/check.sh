#!/usr/bin/env bash
# The GPU check (gpu/check.py): kernel tests, every mixer trained eager and compiled, plain and
# with latents, cached generation, DDP on two GPUs when there are two. One table; the record is
# written to OUT_DIR/check.json (copy it to records/gpu/check/ to cite it).
# Usage: bash gpu/check.sh [OUT_DIR] [extra gpu/check.py arguments]
set -o pipefail
OUT_DIR=${1:-gpu/results}
shift || true
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
# pyproject maps the package ltm.kernels to kernels/; without an install a link does the same
[ -e ltm/kernels ] || ln -s ../kernels ltm/kernels
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_DIR/check.log"
python3 gpu/check.py --out "$OUT_DIR" "$@" 2>&1 | tee -a "$OUT_DIR/check.log"
