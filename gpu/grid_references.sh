#!/usr/bin/env bash
# The kernel grid against fla as users install it, backends included (issue 43), on one GPU.
#
#   bash gpu/grid_references.sh install            # fla-core, tilelang, flash-qla, apache-tvm-ffi,
#                                                  # torch-c-dlpack-ext from the wheels in .whl
#   bash gpu/grid_references.sh z3                 # z3-solver (which TileLang links) from .whl2:
#                                                  # the next call, on the same warm machine
#   bash gpu/grid_references.sh grid ARGS...       # gpu/kernel_grid.py ARGS (--out gpu/results)
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
step=${1:?install, z3, grid or run}
shift
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache} FLA_CACHE_RESULTS=1
[ -e ltm/kernels ] || ln -sfn ../kernels ltm/kernels
case "$step" in
    install) install .whl ;;
    z3) install .whl2 ;;
    grid) python3 gpu/kernel_grid.py --out gpu/results "$@" ;;
    run) "$@" ;;
    *) echo "unknown step $step: install, z3, grid or run" >&2; exit 2 ;;
esac
