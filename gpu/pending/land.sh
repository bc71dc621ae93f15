#!/usr/bin/env bash
# What a pending gated-delta-rule patch needs on a GPU, once applied and committed as HASH: the GPU
# check alone (beside the kernel tests it ran out of memory), the warm-up sweep that decides
# (gpu/warmup_sweep.py's variants, SWEEP: off = exact passes; def = the defaults; on2 = warm-ups
# forced; on2a = the same with the forward's wide always), where the host's time goes
# (gpu/host_profile.py), the warm-up and launch kernel tests, then the measurements issue 55 still
# lacks: fla as installed (with FlashQLA) beside ours by the kernel grid on the shapes no call
# reached yet (FLA_SHAPES), both kernel by kernel (gpu/kernel_breakdown.py), the plain delta rule
# and RWKV-7 against fla's Triton path at this commit, the deep Titans memory's two-loop bench
# (`titans-two-loops-bench.sh`, where its `deep_bwd_before.py` was made), the Titans memory's
# kernels under Nsight Compute (`gpu/ncu_titans.py`) and its launch variants
# (`gpu/titans_profile.py`), then `gpu/auto.sh`. With
# no patch pending, SKIP="check sweep tests host" goes straight to the measurements (HASH: the
# commit measured).
# fla's wheels travel in two calls (`gpu/grid_references.sh`: .whl, then .whl2 with z3-solver):
# fla's sweep waits for both, so carry .whl in the first call and .whl2 in the second.
# Each stage is skipped where a call before this one on the same machine finished it: run it
# again at once until it says "done" (the machine goes back after 30 s idle).
#   bash gpu/pending/land.sh OUT_DIR HASH [SECONDS_AVAILABLE]
set -uo pipefail
OUT_DIR=$1 HASH=$2 BUDGET=${3:-560}
# the kernel tests: those of the warm-ups and segments, the launches this change touched (the
# whole files passed at 53e1b59; cold, they need more than the 230 s a call has after the check)
TESTS_K=${TESTS_K:-"warmup or exact_heads or segment or launch"}
STATE=/tmp/land-$HASH
SWEEP=${SWEEP:-off,def,on2,on2a}
# TESTS_S caps the kernel tests' seconds; TESTS_LAST=1 runs them after fla and the Titans bench
TESTS_S=${TESTS_S:-600}
mkdir -p "$OUT_DIR" "$STATE"
for stage in ${SKIP:-}; do touch "$STATE/$stage"; done
export PYTHONPATH=$PWD TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1
[ -e ltm/kernels ] || ln -s ../kernels ltm/kernels
log() { echo "$*" | tee -a "$OUT_DIR/log"; }
left() { echo $((BUDGET - SECONDS)); }
log "$(nvidia-smi -L | head -1); commit $HASH; $(ls "$STATE" | tr '\n' ' ')already done"
kernel_tests() {
  [ ! -e "$STATE/tests" ] && [ "$(left)" -gt 200 ] || return 0
  local limit=$(($(left) - 10)); [ "$limit" -gt "$TESTS_S" ] && limit=$TESTS_S
  timeout "$limit" python3 -m pytest -q -n 8 -p no:warnings -p no:cacheprovider \
    tests/kernels/test_kernels_delta_rule.py tests/kernels/test_kernels_launch_options.py \
    tests/kernels/test_kernels_state_passes.py tests/kernels/test_kernels_delta_rule_overlapped.py \
    tests/kernels/test_kernels_delta_rule_fused_output.py -k "$TESTS_K" > "$OUT_DIR/tests.log" 2>&1
  rc=$?
  log "kernel tests rc $rc at $SECONDS s: $(tail -1 "$OUT_DIR/tests.log")"
  grep -E "^(FAILED|ERROR)" "$OUT_DIR/tests.log" | head -20 | tee -a "$OUT_DIR/log"
  [ $rc -eq 0 ] && touch "$STATE/tests"
}
if [ ! -e "$STATE/check" ] && [ "$(left)" -gt 300 ]; then
  timeout $(($(left) - 10)) bash gpu/check.sh "$OUT_DIR/chk" --no-tests --commit "$HASH" > "$OUT_DIR/chk.log" 2>&1
  rc=$?
  log "check rc $rc at $SECONDS s: $(tail -1 "$OUT_DIR/chk.log")"
  grep FAIL "$OUT_DIR/chk.log" | head | tee -a "$OUT_DIR/log"
  [ $rc -eq 0 ] && touch "$STATE/check"
fi
if [ ! -e "$STATE/sweep" ] && [ "$(left)" -gt 90 ]; then
  timeout $(($(left) - 5)) python3 gpu/warmup_sweep.py "$OUT_DIR/sweep.json" \
    "1,32768,8,128;1,32768,8,128w;2,8192,8,128;3,5000,12,128;4,4096,16,128;8,2048,8,128" \
    "$SWEEP" 2>&1 | tee -a "$OUT_DIR/log"
  [ "${PIPESTATUS[0]}" -eq 0 ] && touch "$STATE/sweep"
fi
# fla's wheels after the check and the sweep, which do not need them (a call short of time
# keeps its seconds for the check)
if [ ! -e "$STATE/site" ] && ls .whl/fla_core-*.whl > /dev/null 2>&1; then
  bash gpu/grid_references.sh install && touch "$STATE/site" && log "fla's wheels installed"
fi
if [ -e "$STATE/site" ] && [ ! -e "$STATE/z3" ] && ls .whl2/z3_solver-*.whl > /dev/null 2>&1; then
  bash gpu/grid_references.sh z3 && touch "$STATE/z3" && log "z3-solver installed"
fi
# where the host's time goes at 8,2048,8,128 (ours; fla too once installed): tens of seconds warm
if [ ! -e "$STATE/host" ] && [ -e "$STATE/sweep" ] && [ "$(left)" -gt 60 ]; then
  timeout $(($(left) - 5)) python3 gpu/host_profile.py 8,2048,8,128 50 > "$OUT_DIR/host.log" 2>&1 \
    && touch "$STATE/host"; log "host profile: $(grep -c . "$OUT_DIR/host.log") lines"
fi
[ -n "${TESTS_LAST:-}" ] || kernel_tests
# fla as installed (FlashQLA on Hopper) beside ours in one process, by the kernel grid (its record
# is the report's, with the backends fla's dispatch log names), CUDA-graph times too: the grid
# shapes no call reached (068164c's H100 call measured 5 of 7), then the H100's worst one. fla
# autotunes once per head group and TileLang compiles once for batch > 1 and once for batch 1
# (~20-110 s a shape)
FLA_SHAPES=${FLA_SHAPES:-"2,6000,6,128;1,32768,4,128;4,4096,16,128"}
if [ ! -e "$STATE/fla" ] && [ -e "$STATE/z3" ] && [ "$(left)" -gt 150 ]; then
  timeout $(($(left) - 5)) bash gpu/grid_references.sh grid --part 1/2 --only gated_delta_rule \
    --no-default --fla-past-hopper-guard --paths fla_installed --graph --commit "$HASH" \
    --budget-s $(($(left) - 60)) --out "$OUT_DIR" --name kernel-grid-references \
    --shapes "$FLA_SHAPES" 2>&1 | tee -a "$OUT_DIR/log"
  [ "${PIPESTATUS[0]}" -eq 0 ] && touch "$STATE/fla"
fi
# kernel by kernel, ours and FlashQLA, at the shapes the fla stage compiled (tens of seconds)
if [ ! -e "$STATE/kernels" ] && [ -e "$STATE/fla" ] && [ "$(left)" -gt 90 ]; then
  timeout $(($(left) - 5)) bash gpu/grid_references.sh run python3 gpu/kernel_breakdown.py \
    "$OUT_DIR/kernels.json" "4,4096,16,128;8,2048,8,128;1,32768,8,128" 10 2>&1 | grep -v TileLang \
    > "$OUT_DIR/kernels.log"; [ "${PIPESTATUS[0]}" -eq 0 ] && touch "$STATE/kernels"
  log "kernel breakdown: $(grep -c "==" "$OUT_DIR/kernels.log") rows"
fi
# the plain delta rule and RWKV-7 against fla's Triton path at this commit (issue 55)
if [ ! -e "$STATE/refs" ] && [ -e "$STATE/fla" ] && [ "$(left)" -gt 150 ]; then
  bash gpu/grid_references.sh refs "$HASH" $(($(left) - 5)) "$OUT_DIR" 2>&1 | tee -a "$OUT_DIR/log"
  [ "${PIPESTATUS[0]}" -eq 0 ] && touch "$STATE/refs"
fi
if [ ! -e "$STATE/titans" ] && [ -e gpu/pending/deep_bwd_before.py ] && [ "$(left)" -gt 120 ]; then
  timeout $(($(left) - 5)) bash gpu/pending/titans-two-loops-bench.sh "$OUT_DIR" && touch "$STATE/titans"
fi
# why the Titans memory's sequential kernels take what they take (ncu stall reasons; about a
# minute a shape once compiled), then the deep memory at chunks 16 and 32 and its hidden tile per
# kernel (`--deep-only`; the larger shape first, each written as it is done)
if [ ! -e "$STATE/ncu" ] && [ "$(left)" -gt 200 ]; then
  timeout $(($(left) - 5)) python3 gpu/ncu_titans.py "$OUT_DIR/ncu" 2>&1 | tail -20 \
    | tee -a "$OUT_DIR/log"; [ "${PIPESTATUS[0]}" -eq 0 ] && touch "$STATE/ncu"
fi
if [ ! -e "$STATE/variants" ] && [ "$(left)" -gt 240 ]; then
  timeout $(($(left) - 5)) python3 gpu/titans_profile.py --deep-only --shapes 2,8192,12,64 \
    8,2048,12,64 --out "$OUT_DIR/titans-profile.json" > "$OUT_DIR/titans-profile.log" 2>&1 \
    && touch "$STATE/variants"
  log "titans variants: $(grep -c depth "$OUT_DIR/titans-profile.log") rows"
fi
[ -z "${TESTS_LAST:-}" ] || kernel_tests
if [ ! -e "$STATE/auto" ] && [ -e "$STATE/fla" ] && [ "$(left)" -gt 240 ]; then
  OUT=$OUT_DIR/auto BUDGET=$(($(left) - 10)) TUNE_S=200 bash gpu/auto.sh > /dev/null 2>&1
  log "auto: $(tail -3 "$OUT_DIR/auto/log" | tr '\n' ' ')"
  [ -s "$OUT_DIR/auto/training.json" ] && touch "$STATE/auto"
fi
if [ -e "$STATE/check" ] && [ -e "$STATE/sweep" ] && [ -e "$STATE/tests" ]; then
  log "done: check, sweep, tests$(for x in host fla kernels refs titans ncu variants auto; do [ -e "$STATE/$x" ] && echo -n ", $x"; done)"
else
  log "not done: run it again at once ($(ls "$STATE" | tr '\n' ' ')done)"
fi
