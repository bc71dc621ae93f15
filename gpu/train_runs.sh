# Sourced by gpu/titans.sh and gpu/titans_triton.sh: short training runs on the GPU profile
# (configs/gpu.yaml) within a budget, and their summary. Needs `out` set and "$out/runs" made.
#   train NAME LIMIT_S ITEM...   # 30 steps with each ITEM as --set, metrics to $out/runs/NAME.json
#   summarise_runs               # tokens/s, peak memory and loss of every run in $out/runs
export PYTHONUNBUFFERED=1
left() { echo $((${BUDGET:-570} - SECONDS)); }
train() {  # name, limit, --set items; the run's log in /tmp/NAME.log, its last lines printed
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
summarise_runs() {
  python3 - "$out/runs" <<'PY'
import json, sys
from pathlib import Path
for path in sorted(Path(sys.argv[1]).glob("*.json")):
    m = json.loads(path.read_text())
    print(f"{path.stem:28s} tokens/s {m.get('tokens_per_s')} peak {m.get('peak_memory_mib')} MiB "
          f"loss {m.get('train_loss')}")
PY
}
