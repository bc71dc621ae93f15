"""How much of a chunked op's measured time is the host's: ours against fla, on one GPU.

    python -m ltm.bench.host_overhead OUT.json [--shapes 8,2048,8,128 2,8192,8,128 ...]
        [--ops delta_rule] [--impls triton,fla]
        [--segments 0 8 16]   # ours: the delta rule's state passes by segments of >= N chunks (0: off)
        [--segment-fill 2 4]  # ... as many as bring the programs to ~N x the SMs
        [--fused-output none inference both]  # which forwards fuse the outputs
        [--overlapped-output none inference both]  # ... overlap them with the state pass
        [--warmup default off on]  # ... the gated state passes' segments by decay warm-ups

Per (op, shape, implementation) and pass (forward; forward+backward), four numbers:
  bench_ms   the median of triton.testing.do_bench, as gpu/kernel_grid.py measures (the host
             launches each call while the GPU runs; where the host is slower, its time shows)
  graph_ms   the median of triton.testing.do_bench_cudagraph: the same calls replayed from a CUDA
             graph, so no host work is left in them (the GPU's time, launch gaps included)
  kernel_ms  the GPU time of the kernels alone per call (torch.profiler, summed)
  host_ms    the host's time per call: 50 calls issued back to back without a synchronisation
             (the GPU's queue never fills at that count), divided by 50
and the floor ratios of bench_ms and graph_ms (ltm.bench.kernels.floor_ms: floor_counts over the
measured copy bandwidth and matmul rate). A bench_ms well above graph_ms is host time the GPU waited for.
OUT.json is rewritten after every row.
"""
from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Callable

import torch
import triton
from torch.profiler import ProfilerActivity, profile

from ltm.bench.kernels import floor_ms, implementations, make_inputs, measure_ceilings
from ltm.bench.timing import gpu_ms, graph_ms, per_call_ms

SHAPES = ["8,2048,8,128", "2,8192,8,128", "8,2048,16,64", "32,2048,4,128", "1,16384,8,64"]
HOST_CALLS = 50
OUTPUT_CHOICES = ["default", "none", "inference", "both"]


def pass_fn(fn: Callable, x: dict, backward: bool) -> Callable[[], object]:
    """One pass as a closure; the backward through autograd.grad, so nothing accumulates."""
    inputs = [t for t in x.values() if t.requires_grad]
    if not backward:
        def forward():
            with torch.no_grad():
                return fn(x)
        return forward
    do = torch.randn_like(fn(x))

    def forward_backward():
        return torch.autograd.grad(fn(x), inputs, do)
    return forward_backward


def kernel_times(step: Callable[[], object], repeats: int = 10) -> dict[str, float]:
    """Each kernel's GPU time per call (ms), by torch.profiler's name, largest first, from
    `repeats` calls."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            step()
        torch.cuda.synchronize()
    times = {e.key: e.device_time_total / repeats / 1e3 for e in prof.key_averages()
             if e.device_time_total > 0}
    return dict(sorted(times.items(), key=lambda kv: -kv[1]))


def kernel_ms(step: Callable[[], object], repeats: int = 10) -> float:
    """The GPU time of the kernels alone per call: torch.profiler's, summed over `repeats` calls."""
    return sum(kernel_times(step, repeats).values())


def measure(step: Callable[[], object]) -> dict:
    """bench_ms, graph_ms, kernel_ms and host_ms of one pass (see the module docstring)."""
    for _ in range(3):  # compiles, autotunes (fla) and warms the allocator before any clock
        step()
    row = {"bench_ms": gpu_ms(step, warmup_ms=10, rep_ms=60)}
    row["graph_ms"] = graph_ms(step, rep_ms=60)
    row["kernel_ms"] = kernel_ms(step)
    # the calls back to back, the clock read before the GPU's queue drains: the host's time
    row["host_ms"] = per_call_ms(step, HOST_CALLS, sync=torch.cuda.synchronize,
                                 wait_for_device=False)
    return row


def launch_options(segments: int, fill: int, fused: str, overlap: str, warmup: str = "default") -> dict:
    """Our delta rule's launch options for one run (`triton_chunk_delta_rule`'s keywords):
    the state passes (forward and backward) by segments of at least `segments` chunks (0: off), as many as bring
    the programs to about `fill` times the SM count; which forwards take the outputs out of the
    state pass (`fused`) and which run the state pass and the outputs in one launch (`overlap`):
    "default" as launch_choices (fused) and segment_choices (overlap) choose, "none", "inference"
    or "both" forced at every shape; the gated state passes' segments, forward and backward, by
    decay warm-ups (`warmup`: "default", "off" or "on")."""
    # 0: off, the module's own default, so that a default run passes no options at all
    return {"segments": (segments, fill) if segments else None,
            "fuse_output": None if fused == "default" else fused,
            "overlap_output": None if overlap == "default" else overlap,
            "warmup": {"default": None, "off": False, "on": True}[warmup]}


def ours_with(options: dict) -> Callable[[dict], torch.Tensor]:
    """Our delta rule (plain or gated, as the inputs hold g) with these launch options."""
    # imported on first use, as everywhere: Triton loads only when a call asks for it
    from ltm.kernels.delta_rule import triton_chunk_delta_rule
    return lambda x: triton_chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], x.get("g"), **options)[0]


def runs_of(impl: str, args: argparse.Namespace) -> list[tuple[int, int, str, str, str]]:
    """(segments, segment fill, fused output, overlapped output, warm-ups) of each run of one
    implementation: every combination asked for ours, the defaults for fla."""
    if impl != "triton":
        return [(0, 2, "default", "default", "default")]
    return [(n, f, fo, ov, wu) for n in args.segments for f in (args.segment_fill if n else [2])
            for fo in args.fused_output for ov in args.overlapped_output for wu in args.warmup]


def shape_rows(op: str, text: str, args: argparse.Namespace, ceilings: dict,
               emit: Callable[[dict], None]) -> None:
    """Every implementation asked for, each of its runs and both passes of `op` at the shape
    `text` (B,T,H,D), a row each, printed and given to `emit`."""
    device = torch.device("cuda")
    shape = tuple(int(n) for n in text.split(","))
    x = make_inputs(op, *shape, torch.bfloat16, device)
    for name, fn in implementations(op, device).items():
        if name not in args.impls.split(","):
            continue
        for (segments, fill, fused, overlap, warmup), backward in itertools.product(
                runs_of(name, args), (False, True)):
            floor = floor_ms(op, *shape, 2, backward, ceilings)
            # the options are the delta rule's: RWKV-7 runs as it is
            run = (ours_with(launch_options(segments, fill, fused, overlap, warmup))
                   if name == "triton" and op != "rwkv7" else fn)
            timings = measure(pass_fn(run, x, backward))
            row = {"op": op, "shape": list(shape), "impl": name, "segments": segments,
                   "segment_fill": fill, "fused_output": fused, "overlapped_output": overlap,
                   "warmup": warmup,
                   "pass": "fb" if backward else "fwd", "floor_ms": floor, **timings}
            row["bench_floor"], row["graph_floor"] = row["bench_ms"] / floor, row["graph_ms"] / floor
            print(f"{op:17s} {text:14s} {name:6s} seg {segments:<2d}/{fill} fo {fused:9s} "
                  f"ov {overlap:9s} wu {warmup:7s} {row['pass']:3s} bench {row['bench_ms']:.3f} "
                  f"graph {row['graph_ms']:.3f} kernels {row['kernel_ms']:.3f} host "
                  f"{row['host_ms']:.3f} ms; floor x{row['bench_floor']:.1f} (graph "
                  f"x{row['graph_floor']:.1f})", flush=True)
            emit(row)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--shapes", nargs="+", default=SHAPES)
    parser.add_argument("--ops", default="delta_rule")
    parser.add_argument("--impls", default="triton,fla", help="of triton (ours), fla")
    parser.add_argument("--segments", nargs="+", type=int, default=[0],
                        help="each run of ours: the delta rule's state passes (forward, backward) by segments of at "
                             "least N chunks (ltm.kernels.delta_rule.segment_choices; 0: off, "
                             "the default)")
    parser.add_argument("--fused-output", nargs="+", default=["default"], choices=OUTPUT_CHOICES,
                        help="ours: which forwards take the outputs out of the state pass, forced "
                             "(default: launch_choices._fuses_output's rule), one run each")
    parser.add_argument("--overlapped-output", nargs="+", default=["default"], choices=OUTPUT_CHOICES,
                        help="ours: which forwards run the state pass and the outputs in one launch, "
                             "forced (default: segment_choices._overlaps_output's rule), "
                             "one run each")
    parser.add_argument("--warmup", nargs="+", default=["default"], choices=["default", "off", "on"],
                        help="ours: the gated state passes' segments (forward and backward) by decay "
                             "warm-ups, forced (default: segment_choices.WARMUP_FORWARD's and "
                             "WARMUP_BACKWARD's rule), one run each")
    parser.add_argument("--segment-fill", nargs="+", type=int, default=[2],
                        help="with segments: programs to about N times the SM count "
                             "(segment_choices.SEGMENT_FILL)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    ceilings = measure_ceilings(torch.device("cuda"), 10, 60)
    rows: list[dict] = []

    def emit(row: dict) -> None:
        rows.append(row)
        Path(args.out).write_text(json.dumps(
            {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
             "triton": triton.__version__, "ceilings": ceilings, "rows": rows}, indent=1) + "\n")

    for op in args.ops.split(","):
        for text in args.shapes:
            shape_rows(op, text, args, ceilings, emit)


if __name__ == "__main__":
    main()
