"""Every kernel of the chunked ops, compiled for an H100 (sm_90) with its launchers' choices,
fits the shared memory a block may have there. The interpreter ignores launch choices, so this
is the CPU's only check of them; an H100 run once failed at 246,784 bytes.

With LTM_PROBE_TRITON set to a folder holding another Triton (`make test-gpu-triton` installs the
GPU machine's there), the kernels compile with that one: a compiler that fails to lower a kernel
fails here, on the CPU (Triton 3.6 failed on one that 3.7 compiled, 2026-12-07)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).with_name("shared_memory_probe.py")
# the most shared memory one thread block may use on an H100 or H200 (227 KB)
HOPPER_BLOCK_SHARED_BYTES = 232_448
KERNELS = {
    "delta_rule": {"_prep_fwd_kernel", "_fwd_kernel", "_output_kernel", "_fwd_overlapped_kernel",
                   "_bwd_local_kernel", "_bwd_state_kernel", "_bwd_chunk_kernel",
                   "_segment_states_kernel"},
    "rwkv7": {"_prep_fwd_kernel", "_fwd_state_kernel", "_output_kernel", "_bwd_state_kernel",
              "_bwd_grad_kernel"},
    "titans": {"_titans_states_kernel", "_titans_output_kernel", "_titans_bwd_local_kernel",
               "_titans_bwd_state_kernel", "_titans_bwd_keys_kernel", "_gates_fwd_kernel",
               "_gates_bwd_kernel"},
    "titans_deep": {"_deep_states_kernel", "_deep_output_kernel", "_deep_bwd_local_kernel",
                    "_deep_bwd_state_kernel", "_gates_fwd_kernel", "_gates_bwd_kernel"},
}


@pytest.mark.parametrize("op", sorted(KERNELS))
def test_every_kernel_fits_the_shared_memory_of_a_hopper_block(op):
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    other = os.environ.get("LTM_PROBE_TRITON")
    if other:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [other, env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, str(PROBE), op], env=env, capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if other:  # (the folder's Triton, not the environment's)
        infos = Path(other).glob("triton-*.dist-info")
        wanted = {info.name[len("triton-"):-len(".dist-info")] for info in infos}
        assert {row["triton"] for row in rows} == wanted, (wanted, rows[:1])
    # both tile precisions (float32, bfloat16) of every kernel the op launches
    assert {(row["kernel"], row["dtype"]) for row in rows} == {
        (kernel, dtype) for kernel in KERNELS[op] for dtype in ("float32", "bfloat16")}
    too_big = [row for row in rows if row["shared"] > HOPPER_BLOCK_SHARED_BYTES]
    assert not too_big, f"over {HOPPER_BLOCK_SHARED_BYTES} bytes of shared memory: {too_big}"
