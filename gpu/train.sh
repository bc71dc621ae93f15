#!/usr/bin/env bash
# Throughput of the train stage's GPU profile (configs/gpu.yaml) on one CUDA GPU: attention and
# deltanet at T=1024, 2048 and 8192 beside a nanoGPT-class GPT-2 baseline (ltm.bench.gpt2_baseline),
# attention with compile off and with the chunked loss, rwkv7, hierarchical deltanet, and deltanet's
# loss curves on the token cache (if there): three seeds each of the triton kernel with and without
# the fused convolution and of the torch kernel.
# Short runs: steps 40, the first 10 left out of tokens/s. Writes one metrics JSON and loss CSV per run under
# OUT/runs, then summary.json and curves.csv under ${OUT:-gpu/results}, and prints a table.
# PARAMS and EXTRA (--set items that win over the runs' own, space-separated) let the script be
# tried on a CPU first; ONLY (a regular expression) picks runs by name; BUDGET (seconds, default
# 570) bounds the whole script.
set -u
params=${PARAMS:-configs/gpu.yaml}
extra=(${EXTRA:-})
out=${OUT:-gpu/results}
runs=$out/runs
mkdir -p "$runs" "$out"
export PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__,
  torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")'
# ltm.kernels is the kernels/ folder mapped in by the package install (pip install -e .)
python3 -c "import ltm.kernels" 2>/dev/null ||
  echo "note: ltm.kernels is not importable here; install the package for the triton runs"

train() {  # name, limit in seconds, then --set overrides; all done within BUDGET s of the start
  local name=$1 limit=$2
  shift 2
  if [[ ! $name =~ ${ONLY:-.} ]]; then return; fi
  local left=$((${BUDGET:-570} - SECONDS))
  if ((left < 40)); then echo "== $name SKIPPED (out of time)"; return; fi
  ((limit > left)) && limit=$left
  local sets=()
  for item in "$@" "${extra[@]}"; do sets+=(--set "$item"); done
  echo "== $name: $*"
  local begin=$SECONDS
  # SIGABRT at the limit: faulthandler then prints where each thread was
  PYTHONFAULTHANDLER=1 timeout -s ABRT -k 20 "$limit" python3 -m ltm.stages.train --params "$params" "${sets[@]}" --no-progress \
    --out-dir "/tmp/ckpt/$name" --metrics "$runs/$name.json" --plot "$runs/$name.csv" \
    || echo "== $name FAILED (exit $?)"
  echo "== $name took $((SECONDS - begin)) s"
}

baseline() {  # name, limit in seconds, then arguments of ltm.bench.gpt2_baseline
  local name=$1 limit=$2
  shift 2
  if [[ ! $name =~ ${ONLY:-.} ]]; then return; fi
  echo "== $name: $*"
  timeout "$limit" python3 -m ltm.bench.gpt2_baseline "$@" | tee "$runs/$name.jsonl" || echo "== $name FAILED"
}

long=(train.seq_len=8192 train.batch_size=2)
mid=(train.seq_len=2048 train.batch_size=8)
baseline gpt2-baseline-T1024-compiled 120 --compile
train attention-T1024-compiled 150
train attention-T1024-B32-compiled 150 train.batch_size=32
train deltanet-T1024-compiled 200 model.mixer=deltanet
train attention-T2048-compiled 150 "${mid[@]}"
train deltanet-T2048-compiled 200 model.mixer=deltanet "${mid[@]}"
# should the compiler fail on the Triton kernels, the eager numbers still come
[ -f "$runs/deltanet-T1024-compiled.json" ] ||
  train deltanet-T1024-eager 60 model.mixer=deltanet train.opt.compile=false
train attention-T8192-compiled 120 "${long[@]}"
train deltanet-T8192-compiled 200 model.mixer=deltanet "${long[@]}"
[ -f "$runs/deltanet-T8192-compiled.json" ] ||
  train deltanet-T8192-eager 60 model.mixer=deltanet train.opt.compile=false "${long[@]}"
train attention-T1024-eager 60 train.opt.compile=false
# the chunked RWKV-7 kernels take minutes to compile under torch.compile (first seen: > 170 s)
train rwkv7-T1024-compiled 400 model.mixer=rwkv7
train rwkv7-T8192-compiled 300 model.mixer=rwkv7 "${long[@]}"
train rwkv7-T1024-eager 90 model.mixer=rwkv7 train.opt.compile=false
train rwkv7-T8192-eager 90 model.mixer=rwkv7 train.opt.compile=false "${long[@]}"
hier=(model.mixer=deltanet model.hierarchical=true)
train deltanet-hier-T1024-compiled 250 "${hier[@]}"
train deltanet-hier-T8192-compiled 250 "${hier[@]}" "${long[@]}"
# fla's chunked delta rule inside the same layer, in place of ours. Our layer is gated, and fla
# 0.6.0 refuses its gated backward on Hopper with Triton < 3.7.1: these fail there, by design
train deltanet-fla-T1024-compiled 250 model.mixer=deltanet model.kernel=fla
train deltanet-fla-T8192-compiled 250 model.mixer=deltanet model.kernel=fla "${long[@]}"
if [ -f data/cache/meta.json ]; then
  real=(model.vocab_size=0 train.data=cache train.opt.compile=false train.steps=60 train.eval_every=20)
  # three seeds of each: the fused convolution, the triton kernel without it, the torch kernel
  for seed in 1 2 3; do
    train deltanet-cache-fused-s$seed 60 model.mixer=deltanet train.seed=$seed "${real[@]}"
    train deltanet-cache-unfused-s$seed 60 model.mixer=deltanet model.fused_conv=false \
      train.seed=$seed "${real[@]}"
    train deltanet-cache-torch-s$seed 60 model.mixer=deltanet model.kernel=torch train.seed=$seed \
      "${real[@]}"
  done
fi
train attention-T1024-compiled-fusedloss 120 train.opt.fused_loss=true
train attention-T8192-compiled-fusedloss 120 train.opt.fused_loss=true "${long[@]}"
train attention-T1024-eager-auto-batch 90 train.opt.compile=false train.batch_size=auto

python3 - "$runs" "$out" <<'PY'
import json, sys
from pathlib import Path
runs, out = Path(sys.argv[1]), Path(sys.argv[2])
keys = ("batch_size", "seq_len", "tokens_per_s", "mfu", "peak_memory_mib", "data_wait_fraction",
        "train_loss", "val_loss")
summary, curves = {}, ["run,step,split,loss"]
for path in sorted(runs.glob("*.json")):
    summary[path.stem] = json.loads(path.read_text())
    curves += [f"{path.stem},{line}" for line in (runs / f"{path.stem}.csv").read_text().split()[1:]]
(out / "summary.json").write_text(json.dumps(summary, indent=1))
(out / "curves.csv").write_text("\n".join(curves) + "\n")
print("| run | " + " | ".join(keys) + " |")
print("|---" * (len(keys) + 1) + "|")
for name, m in summary.items():
    print(f"| {name} | " + " | ".join(str(m.get(k)) for k in keys) + " |")
def curve(name):
    rows = [line.split(",") for line in (runs / f"{name}.csv").read_text().split()[1:]]
    return [float(loss) for _, split, loss in rows if split == "train"]
for variant in ("fused", "unfused"):
    seeds = [name[-1] for name in summary if name.startswith(f"deltanet-cache-{variant}-s")]
    for seed in seeds:
        if f"deltanet-cache-torch-s{seed}" not in summary:
            continue
        ours, ref = curve(f"deltanet-cache-{variant}-s{seed}"), curve(f"deltanet-cache-torch-s{seed}")
        diffs = [(a - b) / b for a, b in zip(ours, ref)]
        print(f"deltanet {variant} vs torch kernel, seed {seed}, {len(diffs)} train losses: "
              f"max |rel diff| {max(map(abs, diffs)):.2e}, mean {sum(diffs) / len(diffs):+.2e}, val "
              f"{summary[f'deltanet-cache-{variant}-s{seed}']['val_loss']:.4f} against "
              f"{summary[f'deltanet-cache-torch-s{seed}']['val_loss']:.4f}")
PY
