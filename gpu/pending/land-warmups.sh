#!/usr/bin/env bash
# What `delta-rule-warmups.patch` and `delta-rule-warmups-wide.patch` need on a GPU, once applied
# and committed as HASH: the GPU check (every mixer, eager and compiled, plain and latent) beside
# the delta-rule kernel tests, then the sweep, each skipped when a call before this one on the same
# machine finished it (a fresh machine's Triton cache makes the tests alone take minutes). Run it
# again, at once, until it says "done" (carry .whl2, then .whl, for FlashQLA's column): the
# machine goes back after 30 s idle.
#   bash gpu/pending/land-warmups.sh OUT_DIR HASH [SECONDS_AVAILABLE]
set -uo pipefail
OUT_DIR=$1 HASH=$2 BUDGET=${3:-570}
STATE=/tmp/land-warmups-$HASH
mkdir -p "$OUT_DIR" "$STATE"
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/triton-cache FLA_CACHE_RESULTS=1 PYTHONUNBUFFERED=1
[ -e ltm/kernels ] || ln -s ../kernels ltm/kernels
log() { echo "$*" | tee -a "$OUT_DIR/log"; }
left() { echo $((BUDGET - SECONDS)); }
# one sweep (gpu/warmup_sweep.py) into OUT_DIR/NAME.json, the stage NAME done when it finishes
sweep() {
  timeout $(($(left) - 5)) python3 gpu/warmup_sweep.py "$OUT_DIR/$1.json" "$2" "$3" 2>&1 \
    | grep -v TileLang | tee -a "$OUT_DIR/log"
  [ "${PIPESTATUS[0]}" -eq 0 ] && touch "$STATE/$1"
}
log "$(nvidia-smi -L | head -1); commit $HASH; $(ls "$STATE" | tr '\n' ' ')already done"
# wheels carried this call (.whl2: fla-core, flash-qla, apache-tvm-ffi, torch-c-dlpack-ext,
# z3-solver; .whl: tilelang; 64 MB a call, so two calls): installed for the last stage
for dir in .whl .whl2; do
  [ -d "$dir" ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site "$dir"/*.whl 2>&1 | tail -1
done

# the GPU check (the landing's gate) from the start, beside the kernel tests, where neither ran yet:
# on a fresh machine the two in turn do not fit one call
check() {
  timeout $(($(left) - 10)) bash gpu/check.sh "$OUT_DIR/chk" --no-tests --commit "$HASH" > "$OUT_DIR/chk.log" 2>&1
  rc=$?
  log "check rc $rc at $SECONDS s: $(tail -1 "$OUT_DIR/chk.log")"
  [ $rc -eq 0 ] && touch "$STATE/check"
}
checking=
if [ ! -e "$STATE/check" ] && [ ! -e "$STATE/tests" ] && [ ! -e "$STATE/tests-failed" ]; then
  check & checking=$!
fi
if [ ! -e "$STATE/tests" ] && [ ! -e "$STATE/tests-failed" ] && [ "$(left)" -gt 120 ]; then
  timeout $(($(left) - 20)) python3 -m pytest -q -n 12 -p no:warnings -p no:cacheprovider \
    tests/kernels/test_kernels_delta_rule.py tests/kernels/test_kernels_launch_options.py \
    tests/kernels/test_kernels_state_passes.py tests/kernels/test_kernels_delta_rule_overlapped.py \
    tests/kernels/test_kernels_delta_rule_fused_output.py tests/kernels/test_kernels_titans_deep.py \
    > "$OUT_DIR/tests.log" 2>&1
  rc=$?
  log "kernel tests rc $rc at $SECONDS s: $(tail -1 "$OUT_DIR/tests.log")"
  grep -E "^(FAILED|ERROR)" "$OUT_DIR/tests.log" | head -20 | tee -a "$OUT_DIR/log"
  [ $rc -eq 0 ] && touch "$STATE/tests"
  [ $rc -eq 1 ] && touch "$STATE/tests-failed"  # (pytest's 1: tests failed; the sweep still runs)
fi
[ -n "$checking" ] && wait "$checking"
if [ -e "$STATE/tests" ] && [ ! -e "$STATE/check" ] && [ -z "$checking" ] && [ "$(left)" -gt 300 ]; then
  check
fi
# the sweep once the change is checked, or where its tests failed (it cannot land; the numbers
# still tell where it stands)
if { [ -e "$STATE/check" ] || [ -e "$STATE/tests-failed" ]; } && [ ! -e "$STATE/sweep" ] \
   && [ "$(left)" -gt 60 ]; then
  # (the shapes and variants that decide most first: the JSON grows row by row, and a cut call
  # keeps what it measured)
  sweep sweep "1,32768,8,128;4,4096,16,128;3,5000,12,128;1,32768,8,128w;8,2048,8,128;2,8192,8,128" \
    off,on2,on4n,on2:b64w8s2,on4,on2n,on4:b64w8s2
fi
# the deep Titans memory (titans-deep-bwd-two-loops.patch, in the same commit) beside its kernel
# before the patch (gpu/pending/deep_bwd_before.py, in a copy of the tree), one process each
if [ -e "$STATE/check" ] && [ -e "$STATE/sweep" ] && [ ! -e "$STATE/titans" ] && [ "$(left)" -gt 150 ] \
   && [ -e gpu/pending/deep_bwd_before.py ]; then
  rm -rf /tmp/before && mkdir -p /tmp/before && cp -r ltm kernels /tmp/before/
  cp gpu/pending/deep_bwd_before.py /tmp/before/kernels/titans/deep_bwd.py
  ok=1
  for tree in "$PWD" /tmp/before; do
    name=$([ "$tree" = "$PWD" ] && echo after || echo before)
    # (after the patch, also heads of 32 and 16: the same chain of phases a chunk with a quarter
    # and a sixteenth of the work; where the time a chunk barely falls, the chain is the floor)
    extra=$([ $name = after ] && echo "2,8192,12,32 2,8192,12,16")
    (cd "$tree" && PYTHONPATH=/tmp/site:$tree timeout $(($(left) - 10)) python3 -m ltm.bench.titans_depths \
      --depths 2 --kernels triton --shapes 8,2048,12,64 2,8192,12,64 $extra \
      --out "$OUT_DIR/titans-$name.json") 2>&1 | tail -20 | tee -a "$OUT_DIR/log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || ok=0
  done
  [ $ok -eq 1 ] && touch "$STATE/titans"
fi
# FlashQLA in the same process as ours, where fla, flash-qla and tilelang are installed (TileLang
# compiles each new shape for minutes: two shapes)
if [ -e "$STATE/sweep" ] && [ ! -e "$STATE/fla" ] && [ "$(left)" -gt 240 ] \
   && python3 -c "import fla, flash_qla, tilelang" 2>/dev/null; then
  sweep fla "1,32768,8,128;2,8192,8,128" off,on2,on4n,fla
fi
if [ -e "$STATE/tests-failed" ]; then
  log "kernel tests FAILED (tests.log): not landable$([ -e "$STATE/sweep" ] && echo '; sweep done')"
elif [ -e "$STATE/sweep" ] && [ -e "$STATE/tests" ] && [ -e "$STATE/check" ]; then
  log "done: tests, check, sweep$([ -e "$STATE/fla" ] && echo ', FlashQLA')"
else
  log "not done: run it again at once ($(ls "$STATE" | tr '\n' ' ')done)"
fi
