#!/usr/bin/env bash
# DDP scaling of the GPU profile (configs/gpu.yaml, attention, T=1024, compiled): one GPU, then
# two through torchrun with the same per-GPU batch. Prints tokens/s and MFU of both.
set -u
out=${OUT:-gpu/results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# NVLink multicast stays off (set by the machine; repeated here for torchrun's workers)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
common=(--params configs/gpu.yaml --no-progress --plot /tmp/ddp_loss.csv)
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m ltm.stages.train "${common[@]}" \
  --out-dir /tmp/ddp1 --metrics "$out/gpu1.json" || echo "== 1 GPU FAILED"
timeout 250 torchrun --standalone --nproc_per_node=2 -m ltm.stages.train "${common[@]}" \
  --out-dir /tmp/ddp2 --metrics "$out/gpu2.json" || echo "== 2 GPUs FAILED"
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
for name in ("gpu1", "gpu2"):
    path = Path(sys.argv[1]) / f"{name}.json"
    if path.exists():
        m = json.loads(path.read_text())
        print(name, m["world_size"], "GPUs:", m["tokens_per_s"], "tok/s, MFU", m["mfu"],
              "peak MiB", m["peak_memory_mib"])
PY
