#!/usr/bin/env bash
# Issue 56 on one GPU: the kernel table of ltm.bench.titans_depths (the Titans memory per depth by
# its Triton kernel and by the chunked PyTorch form, beside our delta rule at the same shapes) and
# training tokens/s of the Titans model with the linear and with the deep memory beside the
# DeltaNet model on the GPU profile (configs/gpu.yaml, compiled). PART=table: the table only;
# PART=2048 or PART=8192: the three training runs at that length. Writes under
# ${OUT:-gpu/results}; BUDGET (s, default 570) bounds the training runs.
set -u
out=${OUT:-gpu/results}
mkdir -p "$out/runs"
[ -e ltm/kernels ] || ln -s ../kernels ltm/kernels
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0))'
source "$(dirname "$0")/train_runs.sh"
titans=(model.mixer=titans model.kernel=triton)
case ${PART:-table} in
  table)
    python3 -m ltm.bench.titans_depths --out "$out/titans_depths.json" || echo "== titans_depths FAILED"
    exit ;;
  2048) shape=(train.seq_len=2048 train.batch_size=8) ;;
  8192) shape=(train.seq_len=8192 train.batch_size=2) ;;
  *) echo "PART must be table, 2048 or 8192, got ${PART}"; exit 2 ;;
esac
train "deltanet-T$PART" 150 model.mixer=deltanet "${shape[@]}"
train "titans-linear-T$PART" 150 "${titans[@]}" model.titans_depth=1 "${shape[@]}"
# the deep memory's chunk step at T 8192: the auto bound (0.4) went nan at step 20, 0.2 trained
# 60 steps (LOG.md, 2026-11-29); at T 2048 auto
deep_step=(); [ "$PART" = 8192 ] && deep_step=(model.titans_max_step=0.2)
train "titans-deep-T$PART" 200 "${titans[@]}" model.titans_depth=2 "${deep_step[@]}" "${shape[@]}"
summarise_runs
