#!/usr/bin/env bash
# Issue 44's GPU targets on one GPU: the Titans linear memory against fla's momentum delta rule
# (ltm.bench.titans_vs_fla), the deep memory's chunked form against its token loops
# (ltm.bench.titans), and training tokens/s of the Titans model (MAG, depth 2, kernel torch)
# beside the DeltaNet model (kernel triton) on the GPU profile (configs/gpu.yaml) at T=2048 and
# T=8192, eager and compiled. Writes under ${OUT:-gpu/results}; BUDGET (s, default 570) bounds it.
set -u
out=${OUT:-gpu/results}
mkdir -p "$out/runs"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0))'
source "$(dirname "$0")/train_runs.sh"
mid=(train.seq_len=2048 train.batch_size=8)
long=(train.seq_len=8192 train.batch_size=2)
titans=(model.mixer=titans model.kernel=torch)
train deltanet-T2048-compiled 120 model.mixer=deltanet "${mid[@]}"
train titans-T2048-eager 120 "${titans[@]}" train.opt.compile=false "${mid[@]}"
train titans-T2048-compiled 150 "${titans[@]}" "${mid[@]}"
train deltanet-T8192-compiled 120 model.mixer=deltanet "${long[@]}"
train titans-T8192-eager 120 "${titans[@]}" train.opt.compile=false "${long[@]}"
summarise_runs
