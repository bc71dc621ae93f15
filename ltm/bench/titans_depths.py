"""Issue 56's kernel table: the Titans memory per depth (linear, and the 2-layer MLP) by its
Triton kernel and by the chunked PyTorch form, beside our delta rule's Triton kernel at the same
(B, T, H, D), forward and forward+backward, in one process.

    python -m ltm.bench.titans_depths [--shapes 8,2048,12,64 2,8192,12,64] [--depths 1 2]
                                      [--kernels triton torch] [--torch-max-tokens 16384]
                                      [--out F.json]

What is held equal: the inputs' shape and dtype (bf16; float32 on the CPU), q and k unit-norm as
the layers feed them. The memory runs as the mixer does by default: chunk_size by depth
(model.titans_chunk_size auto: 64 linear, 32 deep; the deep memory's kernel also takes 16), grad_clip 1.0, gates in the mixer's ranges (theta ~0.1, alpha
~0.01, eta ~0.9), the deep memory's hidden width 2 D. The delta rule runs at its own chunk size
(64): each op as a user would run it. `x_delta_rule` = the row's time / the delta rule's (issue
56's target for the linear memory: <= 1.2). Times: do_bench medians on a GPU; on the CPU, the
host clock through Triton's interpreter (a check that the script runs, not a speed).
"""
from __future__ import annotations

import argparse
import json
from typing import Callable

import torch
import torch.nn.functional as F

from ltm.bench.timing import gpu_ms, host_ms
from ltm.model.config import CHUNK_AUTO
from ltm.ops.titans import titans_memory

CLIP = 1.0  # the mixer's default (model.titans_grad_clip); the chunk: CHUNK_AUTO by depth


def chunk_of(depth: int) -> int:
    """The mixer's default chunk for a memory of `depth` layers (model.titans_chunk_size auto)."""
    return CHUNK_AUTO[min(depth, 2)]


def make_inputs(B: int, T: int, H: int, D: int, dtype: torch.dtype, device: str,
                seed: int = 0) -> dict:
    """Unit q, k; v; the memory's gates; beta for the delta rule (all leaves)."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, device=device)

    def unit():
        return F.normalize(torch.randn(B, T, H, D, generator=gen, device=device), dim=-1)

    x = {"q": unit(), "k": unit(), "v": torch.randn(B, T, H, D, generator=gen, device=device),
         "theta": 0.2 * rand(B, T, H), "alpha": 0.02 * rand(B, T, H),
         "eta": 0.85 + 0.1 * rand(B, T, H), "beta": rand(B, T, H)}
    return {name: t.to(dtype).requires_grad_() for name, t in x.items()}


def memory_weights(depth: int, H: int, D: int, device: str) -> list[torch.Tensor]:
    """The initial memory as the mixer makes it: [H, d_in, d_out] per layer, hidden width 2 D,
    random hidden layers and a zero last one."""
    dims = [D] + [2 * D] * (depth - 1) + [D]
    gen = torch.Generator(device=device).manual_seed(1)
    return [(torch.randn(H, i, o, generator=gen, device=device) * i ** -0.5 if n < depth - 1
             else torch.zeros(H, i, o, device=device)).requires_grad_()
            for n, (i, o) in enumerate(zip(dims[:-1], dims[1:]))]


def runners(x: dict, depths: list[int], kernels: list[str], max_torch_tokens: int
            ) -> dict[str, Callable[[], torch.Tensor]]:
    """name -> a call returning the output, for the delta rule and each (depth, kernel)."""
    # imported on first use, as everywhere: Triton loads only when a call asks for it
    from ltm.kernels.delta_rule import triton_chunk_delta_rule
    B, T, H, D = x["q"].shape
    calls = {"delta_rule triton": lambda: triton_chunk_delta_rule(
        x["q"], x["k"], x["v"], x["beta"])[0]}
    for depth in depths:
        weights = memory_weights(depth, H, D, x["q"].device.type)
        for kernel in kernels:
            if kernel == "torch" and B * T > max_torch_tokens:
                continue  # a Python loop over chunks: minutes at long shapes
            calls[f"titans depth {depth} {kernel}"] = (
                lambda kernel=kernel, weights=weights, chunk=chunk_of(depth): titans_memory(
                    x["q"], x["k"], x["v"], x["theta"], x["alpha"], x["eta"], weights,
                    kernel=kernel, chunk_size=chunk, grad_clip=CLIP)[0])
    return calls


def time_ms(call: Callable[[], torch.Tensor], backward: bool, leaves: list[torch.Tensor],
            on_gpu: bool) -> float:
    """Median ms of one forward (and backward) of `call`."""
    def run():
        out = call()
        if backward:
            out.float().sum().backward()
    if on_gpu:
        return gpu_ms(run, warmup_ms=10, rep_ms=100, grad_to_none=leaves)
    return host_ms(run, 1, warmup=1)


def table(shapes: list[str], depths: list[int], kernels: list[str], device: str,
          max_torch_tokens: int = 16384) -> list[dict]:
    """One row per shape, pass and implementation; each titans row's ratio to the delta rule."""
    on_gpu = device == "cuda"
    dtype = torch.bfloat16 if on_gpu else torch.float32
    rows = []
    for shape in shapes:
        B, T, H, D = (int(n) for n in shape.split(","))
        x = make_inputs(B, T, H, D, dtype, device)
        calls = runners(x, depths, kernels, max_torch_tokens)
        for backward in (False, True):
            timed = {name: time_ms(call, backward, list(x.values()), on_gpu)
                     for name, call in calls.items()}
            base = timed["delta_rule triton"]
            for name, ms in timed.items():
                row = {"shape": shape, "pass": "fwd+bwd" if backward else "fwd", "impl": name,
                       "ms": round(ms, 4), "x_delta_rule": round(ms / base, 3)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["8,2048,12,64", "2,8192,12,64",
                                                        "3,1000,12,64"])
    parser.add_argument("--depths", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--kernels", nargs="+", default=["triton", "torch"])
    parser.add_argument("--torch-max-tokens", type=int, default=16384,
                        help="skip the chunked PyTorch form above this many B*T tokens")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    for shape in args.shapes:
        parts = shape.split(",")
        if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
            parser.error(f"--shapes: expected B,T,H,D as four positive ints, got {shape!r}")
    rows = table(args.shapes, args.depths, args.kernels, args.device, args.torch_max_tokens)
    if args.out:
        import triton
        env = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
               "torch": torch.__version__, "triton": triton.__version__}
        with open(args.out, "w") as f:
            json.dump({"env": env, "chunk_size": {d: chunk_of(d) for d in args.depths},
                       "grad_clip": CLIP, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
