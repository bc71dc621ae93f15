#!/usr/bin/env bash
# Issue 44 on one GPU, the Triton memory: its tests on the GPU (CASES grow there; bf16 and fp16
# too), the linear memory against fla's momentum delta rule (gpu/titans_vs_fla.py) at grid shapes,
# and training tokens/s of the Titans model with the linear memory (titans_depth 1, kernel triton)
# beside the DeltaNet model on the GPU profile. PART=1: tests, kernel table, T=2048; PART=2:
# T=8192. Writes under ${OUT:-gpu/results}; BUDGET (s, default 570) bounds it.
set -u
out=${OUT:-gpu/results}
mkdir -p "$out/runs"
export PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0))'
left() { echo $((${BUDGET:-570} - SECONDS)); }
train() {  # name, limit, --set items
  local name=$1 limit=$2; shift 2
  (($(left) < 40)) && { echo "== $name SKIPPED (out of time)"; return; }
  ((limit > $(left))) && limit=$(left)
  local sets=(); for item in "$@"; do sets+=(--set "$item"); done
  echo "== $name: $*"
  timeout -k 10 "$limit" python3 -m ltm.stages.train --params configs/gpu.yaml "${sets[@]}" \
    --set train.steps=30 --no-progress --out "/tmp/runs/$name" --metrics "$out/runs/$name.json" \
    > "/tmp/$name.log" 2>&1 || { echo "== $name FAILED (exit $?)"; tail -5 "/tmp/$name.log"; }
  grep -v "^\s*$" "/tmp/$name.log" | tail -3
}
titans=(model.mixer=titans model.kernel=triton model.titans_depth=1)
if [[ ${PART:-1} == 1 ]]; then
  timeout 150 python3 -m pytest -q tests/kernels/test_kernels_titans.py \
    tests/model/test_titans_mixer.py -k "triton or token_loop" 2>&1 | tail -4
  timeout 150 python3 gpu/titans_vs_fla.py --shapes 8,2048,8,64 8,2048,8,128 16,4096,8,64 \
    1,16384,8,64 --chunks 16 64 --kernels triton --out "$out/titans_vs_fla.json" \
    || echo "== titans_vs_fla FAILED"
  mid=(train.seq_len=2048 train.batch_size=8)
  train titans-linear-T2048 170 "${titans[@]}" "${mid[@]}"
  train deltanet-T2048 150 model.mixer=deltanet "${mid[@]}"
else
  long=(train.seq_len=8192 train.batch_size=2)
  train deltanet-T8192 150 model.mixer=deltanet "${long[@]}"
  train titans-linear-T8192 150 "${titans[@]}" "${long[@]}"
fi
python3 - "$out/runs" <<'PY'
import json, sys
from pathlib import Path
for path in sorted(Path(sys.argv[1]).glob("*.json")):
    m = json.loads(path.read_text())
    print(f"{path.stem:28s} tokens/s {m.get('tokens_per_s')} peak {m.get('peak_memory_mib')} MiB loss {m.get('train_loss')}")
PY
