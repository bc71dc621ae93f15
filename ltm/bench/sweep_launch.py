"""Time of our Triton ops under each launch configuration a kernel may take, one kernel at a time
(the others on their defaults), to check the tuner's lists and to build a heuristic table from.

    python -m ltm.bench.sweep_launch [rwkv7_loop] [delta_rule] [rwkv7] [--shapes "B,T,H,D;..."]
        [--wide] [--only KERNEL,...]    # e.g. --only delta_rule.bwd_chunk
        [--part I/N] [--compile-only]  # fill Triton's cache in N processes

`delta_rule` / `rwkv7`: every configuration on the list of every kernel of the chunked op
(`ltm.kernels.delta_rule.chunk`, `ltm.kernels.rwkv7.chunk`: `*_configs` of the shape's class),
forced through `ltm.kernels.tuning.FORCED`; the op's forward time for the forward kernels (for
the state pass with the outputs fused: the forward under no_grad, "inf", and the training
forward with it forced on, "fwd+fused"), its forward+backward for the backward ones (the mean
of triton.testing.do_bench, its default when the sweeps were recorded; bf16 inputs as a layer
feeds them, gated delta rule); the fused and overlapped state passes are taken through the op's
`fuse_output` / `overlap_output` options. `rwkv7_loop`: the RWKV-7 token loop's value block and
warps, passed as `triton_fused_recurrent_rwkv7(value_block=..., num_warps=...)`.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
from typing import Callable, Iterator
from unittest import mock

import torch
import triton

from ltm.bench.kernels import make_inputs
from ltm.bench.timing import gpu_ms
from ltm.kernels import tuning
from ltm.kernels.common import dot_precision
from ltm.kernels.delta_rule import chunk as delta_rule_chunk
from ltm.kernels.rwkv7 import chunk as rwkv7_chunk
from ltm.kernels.rwkv7 import fused_recurrent as rwkv7_module

SHAPES = [(8, 2048, 8, 128), (16, 1024, 12, 64)]


def forward_ms(fn: Callable[[dict], torch.Tensor], x: dict) -> float:
    """Mean ms of the op's forward (do_bench, 25 ms warm-up, 100 ms timed)."""
    return gpu_ms(lambda: fn(x), warmup_ms=25, rep_ms=100, return_mode="mean")


def fwd_bwd_ms(fn: Callable[[dict], torch.Tensor], x: dict) -> float:
    """Mean ms of one forward+backward after one untimed call (do_bench, 25 ms warm-up, 150 ms
    timed)."""
    def once():
        out = fn(x)
        out.backward(grad)
    grad = torch.randn_like(fn(x))
    once()
    return gpu_ms(once, warmup_ms=25, rep_ms=150, return_mode="mean")


def rwkv7_loop_rows(shapes: list[tuple]) -> Iterator[tuple[str, tuple, str, float]]:
    """The RWKV-7 token loop's forward+backward per value block and warp count."""
    for shape, value_block, warps in itertools.product(shapes, (8, 16, 32), (2, 4, 8)):
        x = make_inputs("rwkv7", *shape, torch.bfloat16, torch.device("cuda"))
        def fn(x):
            return rwkv7_module.triton_fused_recurrent_rwkv7(x["r"], x["w"], x["k"], x["v"], x["a"], x["b"],
                                                             value_block=value_block, num_warps=warps)[0]
        yield "rwkv7", shape, f"BV={value_block} warps={warps}", fwd_bwd_ms(fn, x)


# the kernels of each chunked op: (tuner name, its list of configurations, timed pass)
KERNELS = {
    "delta_rule": [("delta_rule.prep", delta_rule_chunk._prep_configs, "fwd"),
                   ("delta_rule.prep", delta_rule_chunk._prep_configs, "inf"),
                   ("delta_rule.fwd", delta_rule_chunk._sequential_configs, "fwd"),
                   ("delta_rule.output", delta_rule_chunk._parallel_configs, "fwd"),
                   ("delta_rule.bwd_local", delta_rule_chunk._bwd_local_configs, "fb"),
                   ("delta_rule.bwd_state", delta_rule_chunk._sequential_configs, "fb"),
                   ("delta_rule.bwd_chunk", delta_rule_chunk._bwd_chunk_configs, "fb"),
                   # the state pass with the outputs fused: the forward without a backward ("inf",
                   # under no_grad) and, forced on, the training forward ("fwd+fused")
                   ("delta_rule.fwd_output", delta_rule_chunk.launch_choices._fused_output_configs, "inf"),
                   ("delta_rule.fwd_output", delta_rule_chunk.launch_choices._fused_output_configs,
                    "fwd+fused"),
                   # the state pass and the outputs in one launch, at the shapes where
                   # `_overlaps_output` takes it: the training forward and the one without a backward
                   ("delta_rule.fwd_overlapped", delta_rule_chunk.launch_choices._overlapped_configs, "fwd"),
                   ("delta_rule.fwd_overlapped", delta_rule_chunk.launch_choices._overlapped_configs, "inf")],
    "rwkv7": [("rwkv7.prep", rwkv7_chunk._prep_configs, "fwd"),
              ("rwkv7.fwd_state", rwkv7_chunk._sequential_configs, "fwd"),
              ("rwkv7.output", rwkv7_chunk._output_configs, "fwd"),
              ("rwkv7.bwd_state", rwkv7_chunk._sequential_configs, "fb")],
}


def op_fn(op: str, **options):
    """The op's output; `options`: the delta rule's launch options (`triton_chunk_delta_rule`)."""
    if op == "rwkv7":
        return lambda x: rwkv7_chunk.triton_chunk_rwkv7(x["r"], x["w"], x["k"], x["v"], x["a"], x["b"])[0]
    return lambda x: delta_rule_chunk.triton_chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"],
                                                              **options)[0]


def wide_sequential(cls) -> list:
    """`--wide`: the sequential kernels over a grid wider than their lists (value blocks 16 and
    32, 2 or 4 warps, 2-4 stages), to see whether a shape class with few programs has a better
    launch the lists miss."""
    return [tuning.config(warps, stages, BV=bv)
            for bv, warps, stages in itertools.product((16, 32), (2, 4), (2, 3, 4))]


def wide_loop(cls) -> list:
    """`--wide` for the delta rule's chunk-parallel kernels (`_bwd_chunk`, `_bwd_local`, `_output`):
    value blocks 32 to 128 (the whole of a 128-wide head at once, as fla's backward takes it on
    Hopper), 4 or 8 warps, 1-3 stages. Launches that ask for more shared memory than a block may
    have fail at compile time and are reported, not timed."""
    return [tuning.config(warps, stages, BV=bv)
            for bv, warps, stages in itertools.product((32, 64, 128), (4, 8), (1, 2, 3))]


def wide_fused(cls) -> list:
    """`--wide` for the state pass with the outputs fused: value blocks 16-64 (it recomputes Q K^T
    per value block), 4 or 8 warps (4 spill 0.3 KB per thread at K = 128, 8 spill 80 bytes:
    ptxas), 2 or 3 stages."""
    return [tuning.config(warps, stages, BV=bv)
            for bv, warps, stages in itertools.product((16, 32, 64), (4, 8), (2, 3))]


def wide_overlapped(cls) -> list:
    """`--wide` for the state pass and the outputs in one launch: the state pass's value blocks 16
    or 32 with 3 or 4 stages, its release every 1, 4 or 16 chunks; the outputs' 128-wide value
    blocks (4 warps: one launch, one warp count)."""
    return [tuning.config(4, stages, BV=bv, BVO=128, LANES=128, EVERY=every)
            for bv, stages, every in itertools.product((16, 32), (3, 4), (1, 4, 16))]


def wide_prep(cls) -> list:
    """`--wide` for the prep (chunk-parallel, 16 x 16 blocks, 255 registers per thread with 2 or
    4 warps, so 4 or 2 programs per SM): 2 or 4 warps under a register cap (Triton's `maxnreg`;
    None: uncapped) that lets more programs share an SM at the cost of spills (ptxas, sm_90, bf16,
    K = 128, 2 warps: 240 / 568 / 868 / 1428 bytes per thread at 255 / 192 / 168 / 128)."""
    stages = 1 if cls[0] > 64 else 2
    return [tuning.config(warps, stages, **({"maxnreg": cap} if cap else {}))
            for warps, cap in itertools.product((2, 4), (None, 192, 168, 128))]


WIDE = {"delta_rule.prep": wide_prep, "delta_rule.fwd_output": wide_fused,
        "delta_rule.fwd_overlapped": wide_overlapped, "delta_rule.fwd": wide_sequential,
        "delta_rule.bwd_state": wide_sequential, "delta_rule.bwd_chunk": wide_loop,
        "delta_rule.bwd_local": wide_loop, "delta_rule.output": wide_loop}


def chunked_rows(op: str, shapes, wide: bool = False, only: set | None = None,
                 part: tuple[int, int] = (0, 1), compile_only: bool = False):
    """Every configuration of every kernel of `op` (of those named in `only`, when given), one at
    a time, the rest on their defaults (with `wide`, only the delta rule's kernels in `WIDE`,
    over their wider grids). `part` (i, n) keeps every n-th configuration from the i-th;
    `compile_only` runs each once untimed, so that n processes fill Triton's cache in parallel
    before one process times them (compiling dozens of launches one after another takes minutes)."""
    module = rwkv7_chunk if op == "rwkv7" else delta_rule_chunk
    for shape in shapes:
        B, T, H, D = shape
        x = make_inputs("rwkv7" if op == "rwkv7" else "gated_delta_rule", *shape, torch.bfloat16,
                        torch.device("cuda"))
        cls = module._shape_class(B, T, H, D, D, dot_precision(torch.bfloat16, D), torch.device("cuda"))
        for name, configs, pass_ in KERNELS[op]:
            if wide and name not in WIDE:
                continue
            if only and name not in only:
                continue
            configs = WIDE[name] if wide else configs
            for index, cfg in enumerate(configs(cls)):
                if index % part[1] != part[0]:
                    continue
                choice = {**cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
                label = " ".join(f"{key}={value}" for key, value in choice.items())
                # the fused state pass's rows take it in every forward, whatever `_fuses_output`
                # would choose; the overlapped one's rows at every shape of two chunks or more
                # (where the fused pass does not: it comes first in a forward without a backward)
                options = ({"fuse_output": "both"} if name == "delta_rule.fwd_output"
                           else {"overlap_output": "both"} if name == "delta_rule.fwd_overlapped" else {})
                fn = op_fn(op, **options)
                with mock.patch.object(tuning, "AUTOTUNE", False), \
                        mock.patch.dict(tuning.FORCED, {name: choice}), \
                        torch.no_grad() if pass_ == "inf" else contextlib.nullcontext():
                    try:
                        if compile_only:
                            fn(x).sum().backward() if pass_ == "fb" else fn(x)
                            torch.cuda.synchronize()
                            continue
                        ms = fwd_bwd_ms(fn, x) if pass_ == "fb" else forward_ms(fn, x)
                    except Exception as err:  # e.g. out of shared memory for this choice
                        print(f"{name} {shape} {label}: {type(err).__name__}: {str(err)[:100]}", flush=True)
                        continue
                yield f"{name} ({pass_})", shape, label, ms


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ops", nargs="*", metavar="OP",
                        help="of delta_rule, rwkv7, rwkv7_loop (default: delta_rule rwkv7)")
    parser.add_argument("--shapes", default=None, metavar="B,T,H,D;...")
    parser.add_argument("--only", default=None, metavar="KERNEL,...",
                        help="these kernels only, e.g. delta_rule.bwd_chunk")
    parser.add_argument("--part", default="0/1", metavar="I/N",
                        help="every N-th configuration from the I-th")
    parser.add_argument("--wide", action="store_true", help="grids wider than the tuning lists")
    parser.add_argument("--compile-only", action="store_true",
                        help="run each configuration once untimed: fills Triton's cache")
    args = parser.parse_args(argv)
    unknown = set(args.ops) - {"delta_rule", "rwkv7", "rwkv7_loop"}
    if unknown:
        parser.error(f"unknown ops {sorted(unknown)}; expected delta_rule, rwkv7, rwkv7_loop")
    args.ops = args.ops or ["delta_rule", "rwkv7"]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    shapes = ([tuple(int(n) for n in s.split(",")) for s in args.shapes.split(";")]
              if args.shapes else SHAPES)
    only = set(args.only.split(",")) if args.only else None
    part = tuple(int(n) for n in args.part.split("/"))
    print(torch.cuda.get_device_name(0), "torch", torch.__version__, "triton", triton.__version__)
    for op in args.ops:
        rows = (rwkv7_loop_rows(shapes) if op == "rwkv7_loop"
                else chunked_rows(op, shapes, args.wide, only, part, args.compile_only))
        for name, shape, choice, ms in rows:
            print(f"{name:26} {','.join(map(str, shape)):15} {choice:40} {ms:8.3f} ms", flush=True)


if __name__ == "__main__":
    main()
