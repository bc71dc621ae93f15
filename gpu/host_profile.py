"""One-off: where the host's time goes in one gated delta rule forward+backward (issue 55: by
do_bench ours took 1.06-1.35 ms at 8,2048,8,128 where its CUDA graph took 0.76). cProfile over
CALLS calls issued without a synchronisation (the GPU's queue does not fill at that count), the
functions with the most own time first, ours and, where installed, fla as
installed.

    python3 gpu/host_profile.py [B,T,H,D] [CALLS]
"""
import cProfile, io, pstats, sys
import torch
from ltm.bench.host_overhead import pass_fn
from ltm.bench.kernels import implementations, make_inputs
from ltm.bench.timing import per_call_ms


def profile_impl(name: str, fn, x: dict, calls: int) -> None:
    step = pass_fn(fn, x, backward=True)
    # (3 untimed calls: compile, autotune, first-call caches)
    host = per_call_ms(step, calls, warmup=3, sync=torch.cuda.synchronize, wait_for_device=False)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        step()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(22)
    print(f"== {name}: host {host:.3f} ms a forward+backward (no profiler), {calls} calls")
    print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:6000])


def main(shape: str = "8,2048,8,128", calls: int = 50) -> None:
    B, T, H, D = map(int, shape.split(","))
    dev = torch.device("cuda")
    x = make_inputs("gated_delta_rule", B, T, H, D, torch.bfloat16, dev)
    impls = implementations("gated_delta_rule", dev)
    for name in ("triton", "fla"):  # fla: as installed, FlashQLA's kernels where it dispatches
        if name in impls:
            profile_impl(name, impls[name], x, calls)


if __name__ == "__main__":
    main(*(sys.argv[1:2] or ["8,2048,8,128"]), *(int(a) for a in sys.argv[2:3]))
