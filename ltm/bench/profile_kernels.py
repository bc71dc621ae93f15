"""Where the time of one forward+backward goes, kernel by kernel (CUDA time from torch.profiler).

    python3 gpu/profile_kernels.py [B,T,H,D] [op,op,...] [--ours]
    # ops: delta_rule, gated_delta_rule, rwkv7; --ours: ours only (fla autotunes for minutes per
    # new head shape on a fresh machine)

Prints, for each op and implementation present (ours, fla), the GPU time of every kernel summed
over the profiled repeats and divided by their number: the per-call cost of each stage.
"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from ltm.bench.kernels import implementations, make_inputs

REPEATS = 10


def one_pass(fn, x):
    out = fn(x)
    out.backward(torch.randn_like(out))


def profile_impl(name, fn, x):
    for _ in range(3):
        one_pass(fn, x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPEATS):
            one_pass(fn, x)
        torch.cuda.synchronize()
    rows = [(e.device_time_total / REPEATS, e.count // REPEATS, e.key) for e in prof.key_averages()
            if e.device_time_total > 0]
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"-- {name}: {total / 1000:.3f} ms of kernels per fwd+bwd")
    for us, calls, key in rows[:14]:
        print(f"   {us / 1000:8.3f} ms  x{calls:<3d} {key[:90]}")


def main():
    impls = ("triton",) if "--ours" in sys.argv else ("triton", "fla")
    argv = [a for a in sys.argv[1:] if a != "--ours"]
    shape = [int(n) for n in (argv[0] if argv else "8,2048,8,128").split(",")]
    device = torch.device("cuda")
    ops = argv[1].split(",") if len(argv) > 1 else ["delta_rule", "gated_delta_rule", "rwkv7"]
    for op in ops:
        x = make_inputs(op, *shape, torch.bfloat16, device)
        for name, fn in implementations(op, device).items():
            if name in impls:
                try:
                    profile_impl(f"{op} {name} {shape}", fn, x)
                except Exception as err:  # fla's gated backward refuses Hopper with this Triton
                    print(f"-- {op} {name}: {type(err).__name__}: {str(err)[:160]}")


if __name__ == "__main__":
    main()
