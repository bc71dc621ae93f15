"""The Titans memory's chunked form against its token loop (issue 44's target: the deep memory's
chunked form >= 10x its token loop), forward and forward+backward, printed as a table.

    python -m ltm.bench.titans [--device cpu] [--batch 1] [--heads 4] [--dim 32] [--seq-len 512]
                               [--chunk 64] [--depths 1,2,4] [--repeats 3] [--threads N]

Random float32 inputs with the mixer's kind of gates (theta ~0.1, alpha ~0.01, eta ~0.9),
grad_clip 1; the MLP's hidden width is 2 * dim. Both forms compute the same function (the loop
takes the same chunk_size). Two token loops: `naive` (the reference, gradients from
torch.func.grad under vmap: mostly that machinery's per-token overhead) and `steps` (the
one-token step chained T times, explicit gradients, the same chunk_size: the fair loop). Times
are medians of --repeats after one untimed run.
"""
from __future__ import annotations

import argparse
from typing import Callable

import torch

from ltm.bench.timing import device_sync, host_ms
from ltm.ops.titans import chunk_titans_memory, naive_titans_memory, titans_memory_step


def step_loop(q, k, v, theta, alpha, eta, weights, *, chunk_size, grad_clip):
    """The sequence as T one-token steps (the same function as the sequence forms)."""
    state, outputs = None, []
    for t in range(q.shape[1]):
        o, state = titans_memory_step(q[:, t], k[:, t], v[:, t], theta[:, t], alpha[:, t],
                                      eta[:, t], weights, state, chunk_size=chunk_size,
                                      grad_clip=grad_clip)
        outputs.append(o)
    return torch.stack(outputs, dim=1), state


def inputs(args: argparse.Namespace, depth: int,
           device: torch.device) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """q, k (unit), v and the three gates, and the MLP's weights (hidden width 2 dim)."""
    gen = torch.Generator().manual_seed(0)
    B, T, H, D = args.batch, args.seq_len, args.heads, args.dim

    def rand(*shape):
        return torch.rand(*shape, generator=gen).to(device)

    x = [torch.randn(B, T, H, D, generator=gen).to(device),
         torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1).to(device),
         torch.randn(B, T, H, D, generator=gen).to(device),
         0.2 * rand(B, T, H), 0.02 * rand(B, T, H), 0.85 + 0.1 * rand(B, T, H)]
    dims = [D] + [2 * D] * (depth - 1) + [D]
    weights = [(torch.randn(H, dims[i], dims[i + 1], generator=gen) * dims[i] ** -0.5).to(device)
               for i in range(depth)]
    return x, weights


def run(form: Callable, x: list[torch.Tensor], weights: list[torch.Tensor], chunk: int,
        backward: bool) -> None:
    """One pass of `form` on fresh leaves (forward+backward with `backward`)."""
    leaves = [t.clone().requires_grad_(backward) for t in x]
    w = [t.clone().requires_grad_(backward) for t in weights]
    o, _ = form(*leaves, w, chunk_size=chunk, grad_clip=1.0)
    if backward:
        o.square().mean().backward()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--depths", default="1,2,4")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None,
                        help="intra-op threads (default: torch's); 1 on a shared 2-core machine, "
                             "where a second spinning thread only slows these small matmuls")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = device_sync(device)
    print(f"torch {torch.__version__}, {device}, threads {torch.get_num_threads()}, B={args.batch} "
          f"T={args.seq_len} H={args.heads} D={args.dim} chunk={args.chunk}")
    print(f"{'depth':>5} {'pass':>8} {'naive ms':>10} {'steps ms':>10} {'chunk ms':>10} "
          f"{'naive/chunk':>12} {'steps/chunk':>12}")
    for depth in (int(d) for d in args.depths.split(",")):
        x, weights = inputs(args, depth, device)
        for backward in (False, True):
            with torch.set_grad_enabled(backward):
                # the reference loop once (it is slow), each after one untimed run
                loop_ms = host_ms(lambda: run(naive_titans_memory, x, weights, args.chunk, backward),
                                  1, sync=sync)
                steps_ms = host_ms(lambda: run(step_loop, x, weights, args.chunk, backward),
                                   args.repeats, sync=sync)
                chunk_ms = host_ms(lambda: run(chunk_titans_memory, x, weights, args.chunk, backward),
                                   args.repeats, sync=sync)
            name = "fwd+bwd" if backward else "fwd"
            print(f"{depth:>5} {name:>8} {loop_ms:>10.1f} {steps_ms:>10.1f} "
                  f"{chunk_ms:>10.1f} {loop_ms / chunk_ms:>11.1f}x {steps_ms / chunk_ms:>11.1f}x",
                  flush=True)


if __name__ == "__main__":
    main()
