"""Where the Titans linear memory's forward+backward time goes on one GPU (kernel "triton"):
the do_bench time, the same pass replayed from a CUDA graph (the GPU's time without the host's),
and every GPU kernel's time per pass (torch.profiler), grouped as our Triton kernels and the rest
(the gate products and their gradients, made by PyTorch).

    python -m ltm.bench.profile_titans [--shapes 8,2048,12,64 ...] [--chunks 16 64] [--clip 1.0]

bf16 q, k, v and gates like the mixer's (see `ltm.bench.titans_vs_fla`). Prints a block per
(shape, chunk); both times are means over the calls (do_bench's default when this was
written, kept so that its numbers compare).
"""
from __future__ import annotations

import argparse
from typing import Callable

import torch
import triton
from torch.profiler import ProfilerActivity, profile

from ltm.bench.timing import gpu_ms, graph_ms
from ltm.ops.titans import titans_memory

REPEATS = 10


def make_leaves(B: int, T: int, H: int, D: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """q, k (unit), v and the three gates in bf16, and the memory's zero weights."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    unit = [torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=gen, device="cuda"), dim=-1)
            for _ in range(2)]
    v = torch.randn(B, T, H, D, generator=gen, device="cuda")
    rand = [torch.rand(B, T, H, generator=gen, device="cuda") for _ in range(3)]
    gates = [0.2 * rand[0], 0.02 * rand[1], 0.85 + 0.1 * rand[2]]
    leaves = [t.bfloat16().requires_grad_() for t in (*unit, v, *gates)]
    return leaves, [torch.zeros(H, D, D, device="cuda", requires_grad=True)]


def pass_fn(leaves: list[torch.Tensor], weights: list[torch.Tensor], chunk: int,
            clip: float | None) -> Callable[[], None]:
    """One forward+backward of the memory (kernel triton) as a call."""
    def run():
        out, _ = titans_memory(*leaves, weights, kernel="triton", chunk_size=chunk, grad_clip=clip)
        torch.autograd.grad(out, [*leaves, *weights], torch.ones_like(out))
    return run


def kernel_rows(run: Callable[[], None]) -> list[tuple[float, int, str]]:
    """(ms per pass, launches per pass, kernel) of every GPU kernel of REPEATS passes."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPEATS):
            run()
        torch.cuda.synchronize()
    rows = [(e.device_time_total / REPEATS / 1000, e.count // REPEATS, e.key)
            for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, reverse=True)


def report(shape: str, chunk: int, clip: float | None) -> None:
    """One (shape, chunk)'s block: the two times, then the 16 longest kernels."""
    B, T, H, D = (int(n) for n in shape.split(","))
    run = pass_fn(*make_leaves(B, T, H, D), chunk, clip)
    # do_bench's default mean, as this profile first printed
    bench = gpu_ms(run, warmup_ms=5, rep_ms=100, return_mode="mean")
    try:
        graph = f"{graph_ms(run, rep_ms=100, return_mode='mean'):.3f}"
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["8,2048,12,64"])
    parser.add_argument("--chunks", nargs="+", type=int, default=[16, 64])
    parser.add_argument("--clip", type=float, default=1.0, help="grad_clip (0: none)")
    args = parser.parse_args(argv)
    print(torch.__version__, triton.__version__, torch.cuda.get_device_name(0))
    for shape in args.shapes:
        for chunk in args.chunks:
            report(shape, chunk, args.clip or None)


if __name__ == "__main__":
    main()
