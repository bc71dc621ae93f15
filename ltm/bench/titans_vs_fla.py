"""The Titans linear memory, ours (`kernel="triton"`, the Triton kernel; `"torch"`, the chunked
PyTorch form) against fla 0.6.0's `chunk_momentum_delta_rule` (issue 44's reference), forward and
forward+backward, on one GPU.

    python -m ltm.bench.titans_vs_fla [--shapes 8,2048,8,64 2,8192,8,128] [--chunks 16 64]
                                      [--kernels triton torch] [--out F.json]

The two do not compute the same function at our chunk sizes: fla's is the exact per-token
gradient (our chunk_size 1), ours takes each chunk's gradients at the chunk's starting weights
(Titans' mini-batch form); the rows say which chunk size ran. bf16 inputs (fla refuses float32),
gates like the mixer's (theta ~0.1, alpha ~0.01, eta ~0.9), no clipping (fla has none). Times are
triton.testing.do_bench means (its default when records/gpu/titans/ was measured); x_fla = fla's
time / ours.
"""
from __future__ import annotations

import argparse
import json

import torch
import triton

from ltm.bench.timing import gpu_ms
from ltm.ops.titans import titans_memory


def make_inputs(B: int, T: int, H: int, D: int, device: str) -> tuple[list[torch.Tensor], list]:
    """q, k (unit), v and the three gates in bf16, and the memory's zero weights."""
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, device=device)

    q = torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=gen, device=device), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=gen, device=device), dim=-1)
    v = torch.randn(B, T, H, D, generator=gen, device=device)
    gates = [0.2 * rand(B, T, H), 0.02 * rand(B, T, H), 0.85 + 0.1 * rand(B, T, H)]
    tensors = [t.bfloat16() for t in (q, k, v)] + [g.bfloat16() for g in gates]
    weights = [torch.zeros(H, D, D, device=device)]
    return tensors, weights


def timed(kernel: str, chunk: int, tensors: list, weights: list, backward: bool) -> float:
    """Mean ms of one pass of the memory under `kernel` (do_bench, 5 ms warm-up, 50 ms timed)."""
    leaves = [t.detach().clone().requires_grad_(backward) for t in tensors]

    def run():
        out, _ = titans_memory(*leaves, weights, kernel=kernel, chunk_size=chunk, grad_clip=None)
        if backward:
            out.float().sum().backward()

    return gpu_ms(run, warmup_ms=5, rep_ms=50, return_mode="mean")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["8,2048,8,64", "2,8192,8,128"])
    parser.add_argument("--chunks", nargs="+", type=int, default=[16, 64])
    parser.add_argument("--kernels", nargs="+", default=["triton", "torch"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    rows = []
    for shape in args.shapes:
        B, T, H, D = (int(n) for n in shape.split(","))
        tensors, weights = make_inputs(B, T, H, D, "cuda")
        for backward in (False, True):
            pass_ = "fwd+bwd" if backward else "fwd"
            try:
                fla_ms = timed("fla", 1, tensors, weights, backward)
            except Exception as err:  # a refusal of fla's is a row, not the end of the run
                fla_ms = None
                print(json.dumps({"shape": shape, "pass": pass_, "fla_error": str(err)[:200]}))
            for kernel, chunk in ((kernel, chunk) for kernel in args.kernels for chunk in args.chunks):
                ms = timed(kernel, chunk, tensors, weights, backward)
                row = {"shape": shape, "pass": pass_, "kernel": kernel, "ours_chunk": chunk,
                       "ours_ms": round(ms, 3),
                       "fla_ms": None if fla_ms is None else round(fla_ms, 3),
                       "x_fla": None if fla_ms is None else round(fla_ms / ms, 3)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "triton": triton.__version__}
        with open(args.out, "w") as f:
            json.dump({"env": env, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
