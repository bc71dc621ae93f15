"""Forward+backward time of one bf16 projection (tokens, 768) -> (tokens, N) against its output
width N: the DeltaNet gate projection's widths before and after padding to a multiple of 8
(ltm/model/mixers.py), alone and fused with q, k, v (model.fused_proj).

    python3 gpu/gemm_width_bench.py [--tokens 16384] [--d-model 768]
"""
from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench


def fwd_bwd_ms(tokens: int, d_model: int, width: int) -> float:
    x = torch.randn(tokens, d_model, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(width, d_model, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16)

    def step():
        torch.nn.functional.linear(x, w).backward(dy)
    return do_bench(step, warmup=25, rep=200)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--d-model", type=int, default=768)
    args = parser.parse_args()
    C = args.d_model
    H = C // 64
    hier, plain = C + 5 * H, C + 2 * H  # gate, beta and decay per state, the mix per head
    for name, width in (("plain", plain), ("hierarchical", hier),
                        ("hierarchical padded", hier + (-hier % 8)),
                        ("fused qkv+hierarchical", 3 * C + hier),
                        ("fused qkv+hierarchical padded", 3 * C + hier + (-hier % 8))):
        ms = fwd_bwd_ms(args.tokens, C, width)
        # 3 matmuls (forward, dX, dW) of 2 * tokens * C * width FLOPs each
        tflops = 6 * args.tokens * C * width / ms / 1e9
        print(f"{name:32s} N={width:5d}  {ms:.4f} ms  {tflops:6.1f} TFLOP/s")


if __name__ == "__main__":
    main()
