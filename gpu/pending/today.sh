#!/usr/bin/env bash
# One call, nothing gated changing: the deep memory's hidden tiles at chunk 32 (gpu/titans_profile.py
# --deep-only; the verdict on gpu/pending/titans-deep-hidden-tiles.patch's tiles against the
# default's), then the plain delta rule and RWKV-7 against fla's Triton path (fla-core alone,
# from .whl-fla)
#   LIMIT=SECONDS bash gpu/pending/today.sh OUT HASH
set -uo pipefail
OUT=$1 HASH=$2
LIMIT=${LIMIT:-590}
mkdir -p "$OUT"
export PYTHONPATH=$PWD TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1
[ -e ltm/kernels ] || ln -s ../kernels ltm/kernels
if [ ! -e /tmp/variants-done ]; then
  timeout 120 python3 gpu/titans_profile.py --deep-only --shapes 2,8192,12,64 8,2048,12,64 \
    --out "$OUT/titans-profile.json" > "$OUT/titans-profile.log" 2>&1 && touch /tmp/variants-done
  echo "titans variants at $SECONDS s: $(grep -c depth "$OUT/titans-profile.log") rows" | tee -a "$OUT/log"
fi
# the new tiles (DEEP_TILES[2]) against the tiles before (DEEP_TILES[0]) at chunk 32, per shape
verdict=$(python3 - "$OUT/titans-profile.json" <<'PY'
import json, sys
try:
    reports = json.load(open(sys.argv[1]))["reports"]
    wins = [r["tiles"][2]["ms"] < r["tiles"][0]["ms"] for r in reports]
    print("keep" if len(wins) == 2 and all(wins) else "drop")
except Exception as err:
    print("unknown", type(err).__name__)
PY
)
echo "tiles verdict: $verdict" | tee -a "$OUT/log"
if [ -d .whl-fla ] && [ $((LIMIT - 5 - SECONDS)) -gt 60 ]; then
  bash gpu/grid_references.sh core
  bash gpu/grid_references.sh refs "$HASH" $((LIMIT - 2 - SECONDS)) "$OUT" 2>&1 | tee -a "$OUT/log"
fi
echo "today.sh done at $SECONDS s" | tee -a "$OUT/log"
