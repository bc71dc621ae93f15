"""The chunked RWKV-7 kernel against the token-loop kernel and fla, bf16, forward and
forward+backward (triton.testing.do_bench means: its default when the record
records/bench/rwkv7-h100-2026-11-22-session3.json was made), then where the chunked kernel's time
goes.

    python -m ltm.bench.rwkv7_chunk [B,T,H,D ...]
"""
from __future__ import annotations

import argparse
from typing import Callable

import torch
import triton
from torch.profiler import ProfilerActivity, profile

from ltm.bench.kernels import _optional, make_inputs
from ltm.bench.timing import gpu_ms
from ltm.kernels.rwkv7 import triton_chunk_rwkv7, triton_fused_recurrent_rwkv7


def times(fn: Callable, args: list[torch.Tensor], grad: torch.Tensor) -> tuple[float, float]:
    """(forward ms, forward+backward ms) of fn(*args), the backward's first call untimed."""
    fwd = gpu_ms(lambda: fn(*args), warmup_ms=25, rep_ms=150, return_mode="mean")

    def once():
        fn(*args)[0].backward(grad)
    once()
    return fwd, gpu_ms(once, warmup_ms=25, rep_ms=150, grad_to_none=list(args), return_mode="mean")


def kernel_breakdown(args: list[torch.Tensor], grad: torch.Tensor) -> None:
    """The chunked kernel's 8 longest GPU kernels per forward+backward (torch.profiler, 5 calls)."""
    def once():
        triton_chunk_rwkv7(*args)[0].backward(grad)
    once()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            once()
        torch.cuda.synchronize()
    rows = sorted(((e.device_time_total / 5, e.key) for e in prof.key_averages()
                   if e.device_time_total > 0), reverse=True)
    print("   " + ", ".join(f"{key[:28]} {us / 1000:.3f} ms" for us, key in rows[:8]), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="*", default=["8,2048,8,128"], metavar="B,T,H,D")
    args = parser.parse_args(argv)
    print(torch.cuda.get_device_name(0), "torch", torch.__version__, "triton", triton.__version__)
    # fla first after ours (its first call autotunes for minutes), the slow token loop last
    impls = {"chunk": triton_chunk_rwkv7}
    fla = _optional("fla.ops.rwkv7", "chunk_rwkv7")
    if fla is not None:
        impls["fla"] = fla
    impls["loop"] = triton_fused_recurrent_rwkv7
    for text in args.shapes:
        shape = tuple(int(n) for n in text.split(","))
        x = make_inputs("rwkv7", *shape, torch.bfloat16, torch.device("cuda"))
        inputs = [x[n] for n in ("r", "w", "k", "v", "a", "b")]
        grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        kernel_breakdown(inputs, grad)
        result = {}
        for name, fn in impls.items():
            fwd, both = result[name] = times(fn, inputs, grad)
            ratio = f"  fla / chunk {both / result['chunk'][1]:.2f}x" if name == "fla" else ""
            print(f"{name:6s} {text:14s} fwd {fwd:8.3f} ms  fwd+bwd {both:8.3f} ms{ratio}", flush=True)


if __name__ == "__main__":
    main()
