#!/usr/bin/env bash
# The deep Titans memory's bench with the backward state kernel's two-loop pass (1) (landed at
# 9bc9dca) beside the kernel before it, one process each. First, on the development machine:
#   git show 67e6e03:kernels/titans/deep_bwd.py > gpu/pending/deep_bwd_before.py   (untracked)
# then on the GPU:
#   bash gpu/pending/titans-two-loops-bench.sh OUT_DIR
# Heads of 32 and 16 (after only) run the same chain of phases a chunk with a quarter and a
# sixteenth of the work: where the time a chunk barely falls, the chain is the floor.
set -uo pipefail
OUT_DIR=$1
mkdir -p "$OUT_DIR"
export TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1
[ -e ltm/kernels ] || ln -s ../kernels ltm/kernels
rm -rf /tmp/before && mkdir -p /tmp/before && cp -r ltm kernels /tmp/before/
cp gpu/pending/deep_bwd_before.py /tmp/before/kernels/titans/deep_bwd.py
for tree in "$PWD" /tmp/before; do
  name=$([ "$tree" = "$PWD" ] && echo after || echo before)
  extra=$([ $name = after ] && echo "2,8192,12,32 2,8192,12,16")
  (cd "$tree" && PYTHONPATH=$tree python3 -m ltm.bench.titans_depths --depths 2 --kernels triton \
    --shapes 8,2048,12,64 2,8192,12,64 $extra --out "$OUT_DIR/titans-$name.json") 2>&1 \
    | tail -20 | tee -a "$OUT_DIR/log"
done
