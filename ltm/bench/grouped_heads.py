"""The hierarchical DeltaNet's two states per head in our Triton delta rule, two ways (issue 17):
stacked (q, k, v concatenated twice along the heads, then the kernel on 2H heads, the layer's
default) against grouped heads (the kernel reads q, k, v through a head map, no copies:
hier_op=dual), and the plain delta rule on H heads as the reference of what one state costs.

    python -m ltm.bench.grouped_heads OUT.json [--shapes B,T,H,D ...]

bf16 inputs as the layer gives them under autocast (q, k L2-normalised; beta in (0, 1); g <= 0),
fwd and fwd+bwd (the gradient of a random projection of o), the mean of
`triton.testing.do_bench` (its default when the records were made) after one untimed call. x_stacked = stacked ms / grouped ms (above 1:
grouped faster); x_plain = grouped ms / plain ms (what the second state costs: 2.0 would be a
second state at full price). About a minute on one H100.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

from ltm.bench.timing import gpu_ms
from ltm.kernels.delta_rule import triton_chunk_delta_rule

# (B, T, H, D): the GPU profile's layer (16 x 1024, 12 heads of 64), then other shapes users run
SHAPES = [(16, 1024, 12, 64), (8, 2048, 8, 128), (4, 4096, 16, 64), (1, 16384, 8, 64),
          (32, 2048, 4, 128)]


def inputs(B: int, T: int, H: int, D: int, groups: int) -> list[torch.Tensor]:
    """q, k, v on H heads and beta, g on `groups` x H, bf16 as under autocast, leaves."""
    dev, bf16 = torch.device("cuda"), torch.bfloat16
    q = torch.randn(B, T, H, D, device=dev).to(bf16)
    k = F.normalize(torch.randn(B, T, H, D, device=dev), dim=-1).to(bf16)
    v = torch.randn(B, T, H, D, device=dev).to(bf16)
    beta = torch.rand(B, T, groups * H, device=dev).to(bf16)
    g = -torch.rand(B, T, groups * H, device=dev) * 0.1
    return [x.requires_grad_() for x in (q, k, v, beta, g)]


def run(way: str, xs: list[torch.Tensor], backward: bool) -> None:
    """One pass of `way`: plain (H heads, the first state's gates), stacked (q, k, v copied to
    2H heads) or grouped (2H states reading H heads through the kernel's head map)."""
    q, k, v, beta, g = xs
    if way == "stacked":
        q, k, v = (torch.cat([x, x], dim=2) for x in (q, k, v))
    if way == "plain":
        beta, g = beta[..., :q.shape[2]], g[..., :q.shape[2]]
    o, _ = triton_chunk_delta_rule(q, k, v, beta, g)
    if backward:
        o.backward(xs[0].new_ones(()).expand_as(o))


def timed(way: str, xs: list[torch.Tensor], backward: bool) -> float:
    """Mean ms of one pass after one untimed call (do_bench's 25 ms warm-up, 100 ms timed)."""
    run(way, xs, backward)
    return gpu_ms(lambda: run(way, xs, backward), warmup_ms=25, rep_ms=100, grad_to_none=xs,
                  return_mode="mean")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--shapes", nargs="*", default=None, metavar="B,T,H,D")
    args = parser.parse_args(argv)
    shapes = ([tuple(int(n) for n in s.split(",")) for s in args.shapes] if args.shapes
              else SHAPES)
    started = time.monotonic()
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "rows": []}
    for B, T, H, D in shapes:
        xs = inputs(B, T, H, D, 2)
        row = {"B": B, "T": T, "H": H, "D": D}
        for pass_, backward in (("fwd", False), ("fwd_bwd", True)):
            for way in ("plain", "stacked", "grouped"):
                row[f"{way}_{pass_}_ms"] = timed(way, xs, backward)
            row[f"x_stacked_{pass_}"] = row[f"stacked_{pass_}_ms"] / row[f"grouped_{pass_}_ms"]
            row[f"x_plain_{pass_}"] = row[f"grouped_{pass_}_ms"] / row[f"plain_{pass_}_ms"]
        record["rows"].append(row)
        print(f"{B},{T},{H},{D}: " + "  ".join(
            f"{p} plain {row[f'plain_{p}_ms']:.3f} stacked {row[f'stacked_{p}_ms']:.3f} "
            f"grouped {row[f'grouped_{p}_ms']:.3f} ms (x_stacked {row[f'x_stacked_{p}']:.2f}, "
            f"grouped/plain {row[f'x_plain_{p}']:.2f})" for p in ("fwd", "fwd_bwd")), flush=True)
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    record["wall_s"] = round(time.monotonic() - started, 1)
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out} in {record['wall_s']:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
