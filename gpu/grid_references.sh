#!/usr/bin/env bash
# The kernel grid against fla as users install it, backends included (issue 43), on one GPU.
#
#   bash gpu/grid_references.sh install            # fla-core, tilelang, flash-qla, apache-tvm-ffi,
#                                                  # torch-c-dlpack-ext from the wheels in .whl
#   bash gpu/grid_references.sh z3                 # z3-solver (which TileLang links) from .whl2:
#                                                  # the next call, on the same warm machine
#   bash gpu/grid_references.sh core               # fla-core alone from .whl-fla (enough for refs)
#   bash gpu/grid_references.sh grid ARGS...       # gpu/kernel_grid.py ARGS (--out gpu/results)
#   bash gpu/grid_references.sh refs HASH SECONDS OUT
#                                                  # the plain delta rule and RWKV-7 against fla's
#                                                  # Triton path at three grid shapes (issue 55)
#   bash gpu/grid_references.sh run CMD ARGS...    # any command with the same environment
#
# The wheels do not fit one call's 64 MiB of carried files together (tilelang 50 MB, z3 29 MB),
# hence two installs into the same folder, SITE (default /tmp/site). Triton's and TileLang's
# caches stay in /tmp between the calls to one warm machine, so each kernel compiles and fla
# autotunes once per machine. The versions measured: fla-core 0.6.0, tilelang 0.1.15,
# flash-qla 0.1.3, apache-tvm-ffi 0.1.12, torch-c-dlpack-ext 0.1.5, z3-solver 4.15.4.0.
set -uo pipefail
SITE=${SITE:-/tmp/site}
install() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$1"/*.whl
}
# the plain delta rule and RWKV-7 against fla's Triton path (issue 55: >= 1.3x everywhere), three
# grid shapes each, in SECONDS at most, records in OUT; exits 1 when an op failed or was cut
refs() {
    local hash=$1 budget=$2 out=$3 ok=0 part op left
    for part_op in "1/2 delta_rule" "2/2 rwkv7"; do
        read -r part op <<< "$part_op"
        left=$((budget - SECONDS)); [ "$left" -gt 40 ] || { ok=1; break; }
        timeout "$left" python3 gpu/kernel_grid.py --part "$part" --only "$op" \
            --no-default --paths fla_triton --commit "$hash" --budget-s $((left / 2)) \
            --out "$out" --name "kernel-grid-references-$op" \
            --shapes "8,2048,8,128;2,8192,8,128;4,4096,16,128" 2>&1 | grep -v TileLang | tail -5
        [ "${PIPESTATUS[0]}" -eq 0 ] || ok=1
    done
    return $ok
}
step=${1:?install, z3, core, grid, refs or run}
shift
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache} FLA_CACHE_RESULTS=1
[ -e ltm/kernels ] || ln -sfn ../kernels ltm/kernels
case "$step" in
    install) install .whl ;;
    z3) install .whl2 ;;
    core) install .whl-fla ;;
    grid) python3 gpu/kernel_grid.py --out gpu/results "$@" ;;
    refs) refs "$@" ;;
    run) "$@" ;;
    *) echo "unknown step $step: install, z3, core, grid, refs or run" >&2; exit 2 ;;
esac
