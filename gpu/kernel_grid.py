"""Our chunked kernels against fla over issue 18's whole shape grid, on one GPU.

    python3 gpu/kernel_grid.py --part 1/2 --out DIR [--budget-s 500] [--commit HASH]   # delta rules
    python3 gpu/kernel_grid.py --part 2/2 --out DIR [--budget-s 500] [--commit HASH]   # RWKV-7, decode
    python3 gpu/kernel_grid.py --tiny                  # a CPU dry run of the bookkeeping (no timings)
    ... --graph    # each pass also replayed from a CUDA graph: the GPU's time without the host's
    ... --shapes "1,32768,8,128;..."   # these shapes only, on or off the grid

fla is timed as users install it (`ltm.bench.references`): its Triton path alone (fla_triton:
FLA_FLASH_QLA=0, FLA_TILELANG=0), and, where flash-qla or tilelang is installed, as installed
(fla_installed: FlashQLA takes the gated delta rule at K = V = 128, TileLang some shared and
RWKV-7 kernels), and for the plain delta rule also fla's gated entry with g = 0 (fla_gated_g0, the
way it reaches FlashQLA). Each path's row says the backends it ran (*_backend, from fla's
dispatch log); fla_fwd / fla_fb is the fastest path (fla_*_ref names it), x_fla ours against it,
x_fla_triton_* ours against the Triton path alone. gpu/grid_references.sh installs the backends.

Part 1/2: the delta rule, plain and gated, at every (B, T, H, D) of `ltm.bench.kernels.GRID_SHAPES`
(B x T 8k-64k tokens, T 512-32k with single sequences of 8k-32k, H 4..32, D 64 and 128), each shape
for both ops in turn (they share our kernels and so our tuning). Part 2/2: RWKV-7 on the same grid,
then the one-token step kernels of both ops at batch 1..64 against the torch step
(`ltm.ops.*.step`), with the floor of reading and writing the float32 state once. `--part all`
runs both in one process (over 10 minutes on an H100 with the tuning of both projects; see below).

Each (op, shape): ours (launch configurations tuned per shape class by `ltm.kernels.tuning`; the
first call, timed as `first_s`, compiles and tunes), ours with every kernel on its default
configuration (`default_*`: what the tuning bought), and fla (its first call autotunes), each
forward and forward+backward, as the median of `triton.testing.do_bench` after one untimed call;
the floor of `ltm.bench.kernels.floor_counts` (bytes over the measured copy bandwidth, FLOPs over
the measured bf16 matmul rate, the larger) and the ratios to it; x_fla = fla ms / our ms (above 1:
we are faster); the errors of o and of every gradient against fla; the configuration each of our
kernels took for the shape's class.

Shapes go most informative first (`ORDER`: the issue's three, then single long sequences, where
B H is smallest, then the rest), and a shape is skipped once `--budget-s` is spent; the JSON is
rewritten after every row, so a run cut at its limit keeps what it measured. The table, the
geometric mean and the worst x_fla per op and pass are printed last.

With --warm, on a GPU, the script first compiles every kernel of the part in parallel: one process
per head shape (H, D) runs ours and fla once at its first grid shape, so Triton's on-disk cache
holds every compiled configuration before the measuring process starts. The warm processes run
with FLA_CACHE_RESULTS=0: fla's autotuning picks made there, under the contention of seven
processes on one GPU, are thrown away, and the measuring process re-runs fla's autotuning alone
on the GPU (only the benchmarking of its configurations, the compilation is cached). Off by
default since 2026-11-25: on a fresh H100 all seven warm processes hit a 150 s limit (168 s
lost), while a run without it measured all 30 (op, shape) pairs of part 1 in 232 s (fla's
autotuning carried in) and 29 of them in ~360 s on a fresh machine.

Time on one H100 (estimate, fresh machine, empty Triton cache): fla's autotuning ~60-100 s per
part (62 s and 32 s for its first delta-rule backward at D = 128 and 64 on 2026-11-23), our
compilation of every configuration on the lists (~20 per head size and integer specialization
of H, some seconds each) and their timing (~1 s per class), ~2 s of measurement per (op, shape).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# --tiny runs the kernels in Triton's interpreter, which must be chosen before they are defined
if "--tiny" in sys.argv or "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ltm.bench import kernel_grid_run as kg  # noqa: E402
from ltm.bench.references import REFERENCES  # noqa: E402


def parse(argv: list | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu/results"))
    parser.add_argument("--name", default="kernel-grid")
    parser.add_argument("--part", default="1/2", choices=sorted(kg.PARTS))
    parser.add_argument("--budget-s", type=float, default=500.0,
                        help="no new shape after this many seconds (decode keeps its own end slot)")
    parser.add_argument("--commit", default=os.environ.get("LTM_COMMIT"))
    parser.add_argument("--only", help="a comma list out of the part's ops (delta_rule, "
                                       "gated_delta_rule, rwkv7, decode)")
    parser.add_argument("--no-default", action="store_true",
                        help="skip the timing of our default configurations")
    parser.add_argument("--warm", action="store_true",
                        help="compile in parallel before the measurements (see the docstring)")
    parser.add_argument("--no-warm", action="store_true",
                        help="no parallel compilation first (the default; kept for old commands)")
    parser.add_argument("--warm-timeout-s", type=float, default=300.0)
    parser.add_argument("--warm-only", help="B,T,H,D: compile this shape's head group and exit "
                                            "(the worker of the parallel warm-up)")
    parser.add_argument("--shapes", default="", metavar="B,T,H,D;...",
                        help="measure these shapes only, in this order (any shapes, on or off the grid)")
    parser.add_argument("--skip", default="", metavar="B,T,H,D;...",
                        help="grid shapes measured by an earlier call, left out of this one")
    parser.add_argument("--fla-past-hopper-guard", action="store_true",
                        help="time fla's gated backward on Hopper with Triton < 3.7.1, which fla "
                             "refuses (its issue #640: results may be wrong there); the row's "
                             "errors against ours show whether they were")
    parser.add_argument("--graph", action="store_true",
                        help="also time each pass replayed from a CUDA graph (the GPU's time, "
                             "no host work): *_graph, x_fla_*_graph")
    parser.add_argument("--paths", metavar="NAME,...",
                        help="time only these fla paths (fla_triton, fla_installed, fla_gated_g0; "
                             "default: every one that applies): each path left out saves its "
                             "autotuning")
    parser.add_argument("--tiny", "--smoke", action="store_true", dest="tiny",
                        help="tiny shapes in Triton's interpreter on the CPU: the bookkeeping only")
    return parser.parse_args(argv)


def main(argv: list | None = None) -> None:
    args = parse(argv)
    kg.check_order()
    known = {ref.name for refs in REFERENCES.values() for ref in refs}
    paths = tuple(args.paths.split(",")) if args.paths else None
    if paths and set(paths) - known:
        raise SystemExit(f"--paths: unknown {sorted(set(paths) - known)}; known: {sorted(known)}")
    grid = kg.Grid(torch.device("cpu" if args.tiny else "cuda"), args.graph, paths=paths)
    order = kg.ORDER
    if args.tiny:
        order = kg.TINY_ORDER
        grid.decode_batches, grid.decode_heads = kg.TINY_DECODE
    if args.shapes:
        order = [tuple(int(n) for n in item.split(",")) for item in args.shapes.split(";") if item]
    skipped = {tuple(int(n) for n in item.split(",")) for item in args.skip.split(";") if item}
    if skipped - set(order):
        raise SystemExit(f"--skip: not grid shapes: {sorted(skipped - set(order))}")
    order = [shape for shape in order if shape not in skipped]
    ops = [op for op in kg.PARTS[args.part] if not args.only or op in args.only.split(",")]
    grid_ops = [op for op in ops if op != "decode"]
    if args.warm_only:
        if not grid_ops:  # a worker that warms nothing would leave the tuning to the measurement
            raise SystemExit(f"--warm-only: no grid op in --part {args.part} --only {args.only}")
        kg.warm_group(grid, grid_ops, tuple(int(n) for n in args.warm_only.split(",")))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.part == "all" else "-part" + args.part.replace("/", "of")
    path = args.out / f"{args.name}{suffix}.json"
    env = {**kg.environment(args.commit), "part": args.part, "ops": ops}
    if args.fla_past_hopper_guard:
        env["fla_past_hopper_guard"] = kg.fla_past_hopper_guard()
    warm = None
    if args.warm and not (args.no_warm or args.tiny):
        extra = ("--paths", args.paths) if args.paths else ()
        warm = lambda ops: kg.warm_in_parallel(__file__, ops, order, args.warm_timeout_s, extra)
    kg.run(grid, ops, order, path, env, args.budget_s, not args.no_default, warm)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
