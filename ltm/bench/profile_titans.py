"""Where the Titans linear memory's forward+backward time goes on one GPU (kernel "triton"):
the do_bench median, the same pass replayed from a CUDA graph (the GPU's time without the host's),
and every GPU kernel's time per pass (torch.profiler), grouped as our Triton kernels and the rest
(the gate products and their gradients, made by PyTorch).

    python3 gpu/profile_titans.py [--shapes 8,2048,12,64 ...] [--chunks 16 64] [--clip 1.0]

bf16 q, k, v and gates like the mixer's (see gpu/titans_vs_fla.py). Prints a block per (shape,
chunk).
"""
from __future__ import annotations

import argparse

import torch
import triton
from torch.profiler import ProfilerActivity, profile

from ltm.ops.titans import titans_memory

REPEATS = 10


def make_leaves(B: int, T: int, H: int, D: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    unit = [torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=gen, device="cuda"), dim=-1)
            for _ in range(2)]
    v = torch.randn(B, T, H, D, generator=gen, device="cuda")
    rand = [torch.rand(B, T, H, generator=gen, device="cuda") for _ in range(3)]
    gates = [0.2 * rand[0], 0.02 * rand[1], 0.85 + 0.1 * rand[2]]
    leaves = [t.bfloat16().requires_grad_() for t in (*unit, v, *gates)]
    return leaves, [torch.zeros(H, D, D, device="cuda", requires_grad=True)]


def pass_fn(leaves, weights, chunk: int, clip: float | None):
    def run():
        out, _ = titans_memory(*leaves, weights, kernel="triton", chunk_size=chunk, grad_clip=clip)
        torch.autograd.grad(out, [*leaves, *weights], torch.ones_like(out))
    return run


def kernel_rows(run) -> list[tuple[float, int, str]]:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPEATS):
            run()
        torch.cuda.synchronize()
    rows = [(e.device_time_total / REPEATS / 1000, e.count // REPEATS, e.key)
            for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, reverse=True)


def report(shape: str, chunk: int, clip: float | None) -> None:
    B, T, H, D = (int(n) for n in shape.split(","))
    run = pass_fn(*make_leaves(B, T, H, D), chunk, clip)
    bench = triton.testing.do_bench(run, warmup=5, rep=100)
    try:
        graph = f"{triton.testing.do_bench_cudagraph(run, rep=100):.3f}"
    except Exception as err:  # a capture that fails says why, and the rest still prints
        graph = f"n/a ({type(err).__name__}: {str(err)[:80]})"
    rows = kernel_rows(run)
    ours = sum(ms for ms, _, key in rows if key.startswith("_titans"))
    total = sum(ms for ms, _, _ in rows)
    launches = sum(n for _, n, _ in rows)
    print(f"-- {shape} chunk {chunk}: fwd+bwd {bench:.3f} ms (do_bench), {graph} ms (CUDA graph); "
          f"kernels {total:.3f} ms in {launches} launches, ours {ours:.3f}, the rest "
          f"{total - ours:.3f}")
    for ms, n, key in rows[:16]:
        print(f"   {ms:8.3f} ms  x{n:<3d} {key[:100]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["8,2048,12,64"])
    parser.add_argument("--chunks", nargs="+", type=int, default=[16, 64])
    parser.add_argument("--clip", type=float, default=1.0, help="grad_clip (0: none)")
    args = parser.parse_args()
    print(torch.__version__, triton.__version__, torch.cuda.get_device_name(0))
    for shape in args.shapes:
        for chunk in args.chunks:
            report(shape, chunk, args.clip or None)


if __name__ == "__main__":
    main()
