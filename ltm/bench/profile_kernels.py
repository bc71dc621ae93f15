"""Where the time of one forward+backward goes, kernel by kernel (CUDA time from torch.profiler).

    python -m ltm.bench.profile_kernels [B,T,H,D] [op,op,...] [--ours]
    # ops: delta_rule, gated_delta_rule, rwkv7; --ours: ours only (fla autotunes for minutes per
    # new head shape on a fresh machine)

Prints, for each op and implementation present (ours, fla), the GPU time of every kernel summed
over the profiled repeats and divided by their number: the per-call cost of each stage.
"""
from __future__ import annotations

import argparse
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from ltm.bench.kernels import implementations, make_inputs

REPEATS = 10
OPS = ["delta_rule", "gated_delta_rule", "rwkv7"]


def one_pass(fn: Callable[[dict], torch.Tensor], x: dict) -> None:
    out = fn(x)
    out.backward(torch.randn_like(out))


def profile_impl(name: str, fn: Callable[[dict], torch.Tensor], x: dict) -> None:
    """Three untimed passes, then the kernels of REPEATS passes, the 14 longest printed."""
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


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", nargs="?", default="8,2048,8,128", metavar="B,T,H,D")
    parser.add_argument("ops", nargs="?", default=",".join(OPS), metavar="op,op,...")
    parser.add_argument("--ours", action="store_true", help="ours only, not fla")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    impls = ("triton",) if args.ours else ("triton", "fla")
    shape = [int(n) for n in args.shape.split(",")]
    device = torch.device("cuda")
    for op in args.ops.split(","):
        x = make_inputs(op, *shape, torch.bfloat16, device)
        for name, fn in implementations(op, device).items():
            if name in impls:
                try:
                    profile_impl(f"{op} {name} {shape}", fn, x)
                except Exception as err:  # fla's gated backward refuses Hopper with this Triton
                    print(f"-- {op} {name}: {type(err).__name__}: {str(err)[:160]}")


if __name__ == "__main__":
    main()
