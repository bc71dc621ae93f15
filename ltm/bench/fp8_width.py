"""Where float8 training pays: one linear's forward+backward, bf16 against torchao's Float8Linear
(dynamic tensorwise scaling, as `train.opt.fp8`), both compiled, over a grid of widths.

    python -m ltm.bench.fp8_width OUT.json [--tokens 16384] [--widths 768,1024,1536,2048,4096]

For each width d: the MLP's up projection d -> 4d, its down projection 4d -> d, and the tied head
d -> 50304 (GPT-2's padded vocabulary). Time is triton.testing.do_bench's mean (its default when
the record was made) of forward and backward (input and weight gradients); the rate is 6 M K N FLOPs (forward 2 M K N, backward twice
that) over it. The ratio is bf16 time over float8 time, measured in the same process.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton

from ltm.bench.provenance import commit
from ltm.bench.timing import gpu_ms

VOCAB = 50304


def fwd_bwd_ms(linear: torch.nn.Module, x: torch.Tensor) -> float:
    """Mean ms of the compiled module's forward+backward after three untimed calls."""
    torch._dynamo.reset()  # a fresh compile per module: no recompile limit across the grid
    compiled = torch.compile(linear)
    with torch.no_grad():
        dy = torch.randn_like(linear(x), dtype=torch.bfloat16)

    def once():
        compiled(x).backward(dy)
    for _ in range(3):  # compile and warm
        once()
    return gpu_ms(once, warmup_ms=10, rep_ms=60, grad_to_none=[x, *linear.parameters()],
                  return_mode="mean")


def shapes(widths: list[int]) -> list[tuple[str, int, int]]:
    """(name, K, N) of the MLP's up and down projections and the head at each width."""
    rows = []
    for d in widths:
        rows += [(f"mlp up d{d}", d, 4 * d), (f"mlp down d{d}", 4 * d, d), (f"head d{d}", d, VOCAB)]
    return rows


def measure(name: str, k: int, n: int, tokens: int) -> dict:
    """One row: bf16 and float8 ms, their TFLOP/s and the ratio, for a (tokens, k) x (k, n)
    linear; torchao is optional, so imported here."""
    from torchao.float8 import convert_to_float8_training
    torch.manual_seed(0)
    plain = torch.nn.Linear(k, n, bias=False, device="cuda")
    fp8 = torch.nn.Sequential(torch.nn.Linear(k, n, bias=False, device="cuda"))
    convert_to_float8_training(fp8)
    x = torch.randn(tokens, k, device="cuda", requires_grad=True)
    flops = 6 * tokens * k * n
    with torch.autocast("cuda", torch.bfloat16):
        bf16_ms, fp8_ms = fwd_bwd_ms(plain, x), fwd_bwd_ms(fp8, x)
    row = {"shape": name, "M": tokens, "K": k, "N": n, "bf16_ms": round(bf16_ms, 4),
           "fp8_ms": round(fp8_ms, 4), "bf16_tflops": round(flops / bf16_ms / 1e9, 1),
           "fp8_tflops": round(flops / fp8_ms / 1e9, 1), "fp8_speedup": round(bf16_ms / fp8_ms, 3)}
    print(f"{name:16} M{tokens} K{k:5} N{n:6}  bf16 {bf16_ms:7.3f} ms {row['bf16_tflops']:6.0f} TF/s"
          f"  fp8 {fp8_ms:7.3f} ms {row['fp8_tflops']:6.0f} TF/s  x{row['fp8_speedup']:.3f}", flush=True)
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--widths", type=lambda t: [int(w) for w in t.split(",")],
                        default=[768, 1024, 1536, 2048, 4096])
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("fp8_width: needs a CUDA GPU of compute capability 8.9+")
    import torchao
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "triton": triton.__version__, "torchao": torchao.__version__, "commit": commit(), "rows": []}
    for name, k, n in shapes(args.widths):
        out["rows"].append(measure(name, k, n, args.tokens))
        Path(args.out).write_text(json.dumps(out, indent=1))
    ratios = [r["fp8_speedup"] for r in out["rows"]]
    print(f"fp8 / bf16 over {len(ratios)} shapes: worst x{min(ratios):.3f}, best x{max(ratios):.3f}")


if __name__ == "__main__":
    main()
