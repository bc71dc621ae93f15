#!/usr/bin/env bash
# Issue 44's GPU targets on one GPU: the Titans linear memory against fla's momentum delta rule
# (gpu/titans_vs_fla.py), the deep memory's chunked form against its token loops
# (gpu/titans_bench.py), and training tokens/s of the Titans model (MAG, depth 2, kernel torch)
# beside the DeltaNet model (kernel triton) on the GPU profile (configs/gpu.yaml) at T=2048 and
# T=8192, eager and compiled. Writes under ${OUT:-gpu/results}; BUDGET (s, default 570) bounds it.
set -u
out=${OUT:-gpu/results}
mkdir -p "$out/runs"
export PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0))'
left() { echo $((${BUDGET:-570} - SECONDS)); }
timeout 120 python3 gpu/titans_vs_fla.py --out "$out/titans_vs_fla.json" || echo "== titans_vs_fla FAILED"
timeout 90 python3 gpu/titans_bench.py --device cuda --batch 2 --heads 8 --dim 64 --seq-len 512 \
  --chunk 64 --depths 1,2 || echo "== titans_bench FAILED"
train() {  # name, limit, --set items
  local name=$1 limit=$2; shift 2
  (($(left) < 40)) && { echo "== $name SKIPPED (out of time)"; return; }
  ((limit > $(left))) && limit=$(left)
  local sets=(); for item in "$@"; do sets+=(--set "$item"); done
  echo "== $name: $*"
  timeout -k 10 "$limit" python3 -m ltm.stages.train --params configs/gpu.yaml "${sets[@]}" \
    --set train.steps=30 --no-progress --out "/tmp/runs/$name" --metrics "$out/runs/$name.json" \
    || echo "== $name FAILED (exit $?)"
}
mid=(train.seq_len=2048 train.batch_size=8)
long=(train.seq_len=8192 train.batch_size=2)
titans=(model.mixer=titans model.kernel=torch)
train deltanet-T2048-compiled 120 model.mixer=deltanet "${mid[@]}"
train titans-T2048-eager 120 "${titans[@]}" train.opt.compile=false "${mid[@]}"
train titans-T2048-compiled 150 "${titans[@]}" "${mid[@]}"
train deltanet-T8192-compiled 120 model.mixer=deltanet "${long[@]}"
train titans-T8192-eager 120 "${titans[@]}" train.opt.compile=false "${long[@]}"
python3 - "$out/runs" <<'PY'
import json, sys
from pathlib import Path
for path in sorted(Path(sys.argv[1]).glob("*.json")):
    m = json.loads(path.read_text())
    print(f"{path.stem:28s} tokens/s {m.get('tokens_per_s')} peak {m.get('peak_memory_mib')} MiB loss {m.get('train_loss'):.3f}")
PY
