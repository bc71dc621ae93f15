#!/usr/bin/env bash
# Issue 44 on one GPU, the Triton memory: its tests on the GPU (CASES grow there; bf16 and fp16
# too), the linear memory against fla's momentum delta rule (ltm.bench.titans_vs_fla) at grid shapes,
# and training tokens/s of the Titans model with the linear memory (titans_depth 1, kernel triton)
# beside the DeltaNet model on the GPU profile. PART=1: tests, kernel table, T=2048; PART=2:
# T=8192. Writes under ${OUT:-gpu/results}; BUDGET (s, default 570) bounds it.
set -u
out=${OUT:-gpu/results}
mkdir -p "$out/runs"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0))'
source "$(dirname "$0")/train_runs.sh"
titans=(model.mixer=titans model.kernel=triton model.titans_depth=1)
if [[ ${PART:-1} == 1 ]]; then
  timeout 150 python3 -m pytest -q tests/kernels/test_kernels_titans.py \
    tests/model/test_titans_mixer.py -k "triton or token_loop" 2>&1 | tail -4
  timeout 150 python3 -m ltm.bench.titans_vs_fla --shapes 8,2048,8,64 8,2048,8,128 16,4096,8,64 \
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
summarise_runs
