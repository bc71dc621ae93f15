"""Our chunked kernels against fla over issue 18's whole shape grid, on one GPU.

    python3 gpu/kernel_grid.py --part 1/2 --out DIR [--budget-s 500] [--commit HASH]   # delta rules
    python3 gpu/kernel_grid.py --part 2/2 --out DIR [--budget-s 500] [--commit HASH]   # RWKV-7, decode
    python3 gpu/kernel_grid.py --tiny                  # a CPU dry run of the bookkeeping (no timings)
    ... --graph    # each pass also replayed from a CUDA graph: the GPU's time without the host's

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
import json
import os
import sys
import time
from pathlib import Path

# --tiny runs the kernels in Triton's interpreter, which must be chosen before they are defined
if "--tiny" in sys.argv or "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ltm.bench.kernel_grid import as_bench_rows, format_run, run_summary  # noqa: E402
from ltm.bench.kernels import GRID_SHAPES, floor_ms, make_inputs, measure_ceilings  # noqa: E402
from ltm.kernels import tuning  # noqa: E402

# the grid's shapes, most informative first: the three (measured before), single long
# sequences (fewest programs in the sequential kernels), the 64k-token shapes, then the rest
FIRST = [(8, 2048, 8, 128), (2, 8192, 8, 128), (8, 2048, 16, 64), (1, 32768, 4, 128),
         (1, 32768, 16, 64), (1, 8192, 4, 128), (1, 16384, 8, 64), (2, 32768, 8, 128),
         (8, 8192, 32, 64)]
ORDER = FIRST + [tuple(s) for s in GRID_SHAPES if tuple(s) not in FIRST]
PARTS = {"1/2": ("delta_rule", "gated_delta_rule"), "2/2": ("rwkv7", "decode"),
         "all": ("delta_rule", "gated_delta_rule", "rwkv7", "decode")}
DECODE_BATCHES = (1, 4, 16, 64)
DECODE_HEADS = ((16, 64), (8, 128))
WARMUP_MS, REP_MS = 10, 60
# what the decode steps are given at the end of a part
DECODE_S = 45
# cuda, or cpu for --tiny (tiny shapes through Triton's interpreter: the bookkeeping, not timings)
DEVICE = torch.device("cuda")
# --graph: also the median of the same pass replayed from a CUDA graph (no host work in it)
GRAPH = False


def bench(fn, warmup: int, rep: int, grads=None) -> float:
    """Median ms of fn: triton.testing.do_bench on the GPU, a host clock on the CPU."""
    if DEVICE.type == "cuda":
        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, grad_to_none=grads,
                                             return_mode="median"))
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return sorted(times)[1]


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def ours(op: str):
    if op == "rwkv7":
        from ltm.kernels.rwkv7 import triton_chunk_rwkv7
        return lambda x: triton_chunk_rwkv7(x["r"], x["w"], x["k"], x["v"], x["a"], x["b"])[0]
    from ltm.kernels.delta_rule import triton_chunk_delta_rule
    return lambda x: triton_chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], x.get("g"))[0]


def fla(op: str):
    try:
        if op == "rwkv7":
            from fla.ops.rwkv7 import chunk_rwkv7
            return lambda x: chunk_rwkv7(x["r"], x["w"], x["k"], x["v"], x["a"], x["b"])[0]
        if op == "gated_delta_rule":
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule
            return lambda x: chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"])[0]
        from fla.ops.delta_rule import chunk_delta_rule
        return lambda x: chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"])[0]
    except ImportError:
        return None


def time_pass(fn, x: dict, backward: bool) -> dict:
    """first_s (the untimed first call: compilation, tuning) and the median ms of one pass."""
    grads = [t for t in x.values() if t.requires_grad]
    with torch.enable_grad() if backward else torch.no_grad():
        sync()
        t0 = time.perf_counter()
        out = fn(x)
        if backward:
            do = torch.randn_like(out)
            out.backward(do)
            step = lambda: fn(x).backward(do)
        else:
            step = lambda: fn(x)
        sync()
        first = time.perf_counter() - t0
        ms = bench(step, WARMUP_MS, REP_MS, grads)
        result = {"first_s": first, "ms": ms}
        if GRAPH and DEVICE.type == "cuda":
            # fresh leaves on the same storage and autograd.grad: the timed .backward() calls
            # above left AccumulateGrad nodes made on the default stream, and capturing a
            # backward through them failed (H100, torch 2.11: "operation failed due to a
            # previous error during capture"); nothing accumulates into .grad in the graph
            leaves = {n: t.detach().requires_grad_(t.requires_grad) for n, t in x.items()}
            inputs = [t for t in leaves.values() if t.requires_grad]
            graphed = ((lambda: torch.autograd.grad(fn(leaves), inputs, do)) if backward
                       else (lambda: fn(leaves)))
            result["graph_ms"] = float(triton.testing.do_bench_cudagraph(graphed, rep=REP_MS,
                                                                         return_mode="median"))
    return result


def measure(fn, x: dict, key: str, row: dict) -> None:
    """row[key_fwd], row[key_fb] (ms) and their first calls' seconds; errors as strings."""
    for backward in (False, True):
        name = f"{key}_{'fb' if backward else 'fwd'}"
        try:
            t = time_pass(fn, x, backward)
            row[name], row[f"{name}_first_s"] = t["ms"], t["first_s"]
            if "graph_ms" in t:
                row[f"{name}_graph"] = t["graph_ms"]
        except Exception as err:  # fla refuses its gated backward on Hopper with Triton < 3.7.1
            row[f"{name}_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"


def grid_row(op: str, shape: tuple, ceilings: dict, with_default: bool) -> dict:
    torch.manual_seed(0)
    x = make_inputs(op, *shape, torch.bfloat16, DEVICE)
    row = {"section": "grid", "op": op, "shape": list(shape)}
    impls = {"ours": ours(op), "fla": fla(op)}
    before = {(r["kernel"], tuple(r["class"])) for r in tuning.chosen()}
    measure(impls["ours"], x, "ours", row)
    row["ours_configs"] = {r["kernel"]: r["best"] for r in tuning.chosen()
                           if (r["kernel"], tuple(r["class"])) not in before}
    if with_default:
        # "ours" above ran tuned when LTM_AUTOTUNE=1 (the library's default is off: see
        # ltm.kernels.tuning); "default" is the untuned launch either way
        tuning.AUTOTUNE, autotune = False, tuning.AUTOTUNE
        try:
            measure(impls["ours"], x, "default", row)
        finally:
            tuning.AUTOTUNE = autotune
    if impls["fla"] is None:
        row["fla_error"] = "not installed"
    else:
        measure(impls["fla"], x, "fla", row)
    for p in ("fwd", "fb"):
        row[f"floor_{p}"] = floor_ms(op, *shape, 2, p == "fb", ceilings)
        if row.get(f"ours_{p}"):
            row[f"x_floor_{p}"] = row[f"ours_{p}"] / row[f"floor_{p}"]
            if row.get(f"fla_{p}"):
                row[f"x_fla_{p}"] = row[f"fla_{p}"] / row[f"ours_{p}"]
            if row.get(f"default_{p}"):
                row[f"tuned_gain_{p}"] = row[f"default_{p}"] / row[f"ours_{p}"]
        if row.get(f"ours_{p}_graph") and row.get(f"fla_{p}_graph"):
            row[f"x_fla_{p}_graph"] = row[f"fla_{p}_graph"] / row[f"ours_{p}_graph"]
            row[f"x_floor_{p}_graph"] = row[f"ours_{p}_graph"] / row[f"floor_{p}"]
    if row.get("ours_fwd") and row.get("fla_fwd"):
        with torch.no_grad():
            o, o_fla = impls["ours"](x).float(), impls["fla"](x).float()
        row["rel_o_vs_fla"] = ((o - o_fla).norm() / o_fla.norm()).item()
        if row.get("fla_fb"):
            row["rel_grad_vs_fla"] = grad_errors(impls, x)
    del x
    if DEVICE.type == "cuda":
        torch.cuda.empty_cache()
    return row


def grid_rows(ops, shapes, ceilings, deadline, emit, with_default: bool) -> None:
    """Shapes outer, ops inner: the plain and gated delta rule share a shape's tuning."""
    for shape in shapes:
        for op in ops:
            if time.time() > deadline:
                emit({"section": "grid", "op": op, "shape": list(shape), "skipped": "budget spent"})
                continue
            emit(grid_row(op, shape, ceilings, with_default))


def head_groups(shapes) -> dict:
    """(H, D) -> the first shape with those heads: fla's autotuning and our kernels' compilation
    are keyed on H and D (never on B or T), so one shape per group warms the whole group."""
    groups: dict = {}
    for shape in shapes:
        groups.setdefault(tuple(shape[2:]), tuple(shape))
    return groups


def warm_group(ops, shape: tuple) -> None:
    """Run ours and fla once, forward and forward+backward, for each op at `shape`: the
    compilation and autotuning of the head group, untimed (errors are the measuring run's)."""
    for op in ops:
        torch.manual_seed(0)
        x = make_inputs(op, *shape, torch.bfloat16, DEVICE)
        for fn in (ours(op), fla(op)):
            if fn is None:
                continue
            for backward in (False, True):
                try:
                    with torch.enable_grad() if backward else torch.no_grad():
                        out = fn(x)
                        if backward:
                            out.backward(torch.randn_like(out))
                except Exception:
                    pass
        del x
    sync()


def warm_in_parallel(ops, shapes, timeout_s: float) -> dict:
    """One `--warm-only H,D` process per head group, all at once, FLA_CACHE_RESULTS=0 (see the
    module docstring); returns each group's exit code and seconds."""
    import subprocess
    env = {**os.environ, "FLA_CACHE_RESULTS": "0"}
    procs = {}
    for (H, D), shape in head_groups(shapes).items():
        # --part all: the worker's default part would filter RWKV-7 out of --only
        cmd = [sys.executable, __file__, "--warm-only", ",".join(map(str, shape)),
               "--part", "all", "--only", ",".join(ops)]
        procs[f"{H},{D}"] = (subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL), time.time())
    done = {}
    for key, (proc, t0) in procs.items():
        try:
            rc = proc.wait(timeout=max(1.0, t0 + timeout_s - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "timeout"
        done[key] = {"rc": rc, "s": round(time.time() - t0, 1)}
    return done


def grad_errors(impls: dict, x: dict) -> dict:
    """|d_ours - d_fla| / |d_fla| per input, one backward each with the same output gradient: the
    GPU check of our backward (the interpreter tests check it against float64 on the CPU)."""
    leaves = [name for name, t in x.items() if t.requires_grad]
    grads = {}
    do = None
    for name in ("ours", "fla"):
        for t in x.values():
            t.grad = None
        out = impls[name](x)
        do = torch.randn_like(out) if do is None else do
        out.backward(do)
        grads[name] = {n: x[n].grad.float().clone() for n in leaves}
    for t in x.values():
        t.grad = None
    return {n: ((grads["ours"][n] - grads["fla"][n]).norm() / grads["fla"][n].norm()).item()
            for n in leaves}


def decode_rows(ceilings, deadline, emit) -> None:
    from ltm.kernels.delta_rule import triton_delta_rule_step
    from ltm.kernels.rwkv7 import triton_rwkv7_step
    from ltm.ops.delta_rule.step import delta_rule_step
    from ltm.ops.rwkv7.step import rwkv7_step
    dev = DEVICE
    for (H, D), B in ((hd, b) for hd in DECODE_HEADS for b in DECODE_BATCHES):
        if time.time() > deadline:
            emit({"section": "decode", "B": B, "H": H, "D": D, "skipped": "budget spent"})
            continue
        torch.manual_seed(0)
        rnd = lambda *s: torch.randn(*s, device=dev, dtype=torch.bfloat16)
        state = torch.randn(B, H, D, D, device=dev)
        kk = torch.nn.functional.normalize(torch.randn(B, H, D, device=dev), dim=-1)
        dr = (rnd(B, H, D), kk.bfloat16(), rnd(B, H, D), torch.rand(B, H, device=dev).bfloat16(),
              -torch.rand(B, H, device=dev))
        rw = (rnd(B, H, D), -torch.rand(B, H, D, device=dev).bfloat16(), rnd(B, H, D), rnd(B, H, D),
              (-kk).bfloat16(), (kk * 0.5).bfloat16())
        # the state is read and written once in float32: the floor of any step
        step_floor = 1e3 * 2 * state.numel() * 4 / ceilings["copy_bytes_per_s"]
        for op, triton_fn, torch_fn, args in (
                ("gated_delta_rule", triton_delta_rule_step, delta_rule_step, dr),
                ("rwkv7", triton_rwkv7_step, rwkv7_step, rw)):
            row = {"section": "decode", "op": op, "B": B, "H": H, "D": D, "floor_ms": step_floor}
            for name, fn in (("triton", triton_fn), ("torch", torch_fn)):
                call = lambda fn=fn: fn(*args, state=state)
                try:
                    call()
                    row[f"{name}_ms"] = bench(call, 5, 25)
                except Exception as err:
                    row[f"{name}_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
            o_t, s_t = triton_fn(*args, state=state)
            o_r, s_r = torch_fn(*args, state=state)
            row["rel_state_vs_torch"] = ((s_t.float() - s_r.float()).norm() / s_r.float().norm()).item()
            if row.get("triton_ms") and row.get("torch_ms"):
                row["speedup"] = row["torch_ms"] / row["triton_ms"]
            emit(row)


def record(env: dict, ceilings: dict, rows: list, elapsed: float) -> dict:
    """The JSON written: the environment, "rows" in ltm.bench.kernels' format, the grid rows as
    measured (with errors against fla and our tuned configurations), the decode steps, and every
    tuned class with the timing of each configuration (`ltm.kernels.tuning.chosen`)."""
    return {**env, "ceilings": ceilings, "elapsed_s": elapsed, "summary": run_summary(rows),
            "rows": as_bench_rows(rows),
            "grid": [r for r in rows if r.get("section") == "grid"],
            "decode": [r for r in rows if r.get("section") == "decode"],
            "tuning": tuning.chosen()}


def environment(commit: str | None) -> dict:
    try:
        import fla
        fla_version = getattr(fla, "__version__", "present")
    except ImportError:
        fla_version = None
    return {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "triton": triton.__version__, "fla": fla_version,
            "commit": commit, "date": time.strftime("%Y-%m-%d"), "dtype": "bfloat16",
            "do_bench": {"warmup_ms": WARMUP_MS, "rep_ms": REP_MS, "return_mode": "median"}}


def fla_past_hopper_guard() -> bool:
    """Lift fla's refusal of the gated backward (chunk_bwd_dqkwg) on Hopper with Triton >= 3.4
    and < 3.7.1: its Triton kernel then runs, so that its time can be compared; fla says its
    results may be incorrect there, so the grid's error columns are the check. True if lifted."""
    try:
        from fla.ops.common import chunk_o
    except ImportError:
        return False
    chunk_o.TRITON_ABOVE_3_7_1 = True
    return True


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu/results"))
    parser.add_argument("--name", default="kernel-grid")
    parser.add_argument("--part", default="1/2", choices=sorted(PARTS))
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
    parser.add_argument("--skip", default="", metavar="B,T,H,D;...",
                        help="grid shapes measured by an earlier call, left out of this one")
    parser.add_argument("--fla-past-hopper-guard", action="store_true",
                        help="time fla's gated backward on Hopper with Triton < 3.7.1, which fla "
                             "refuses (its issue #640: results may be wrong there); the row's "
                             "errors against ours show whether they were")
    parser.add_argument("--graph", action="store_true",
                        help="also time each pass replayed from a CUDA graph (the GPU's time, "
                             "no host work): *_graph, x_fla_*_graph")
    parser.add_argument("--tiny", "--smoke", action="store_true", dest="tiny",
                        help="tiny shapes in Triton's interpreter on the CPU: the bookkeeping only")
    args = parser.parse_args(argv)
    global DEVICE, ORDER, DECODE_BATCHES, DECODE_HEADS, GRAPH
    assert all(8192 <= B * T <= 65536 and 512 <= T <= 32768 for B, T, _, _ in ORDER), \
        "a grid shape outside 8k-64k tokens or T 512-32k"
    assert sorted(ORDER) == sorted(tuple(s) for s in GRID_SHAPES), "ORDER must be the grid, reordered"
    DEVICE = torch.device("cpu" if args.tiny else "cuda")
    GRAPH = args.graph
    if args.tiny:
        ORDER = [(1, 70, 2, 32), (2, 20, 1, 64)]
        DECODE_BATCHES, DECODE_HEADS = (1, 2), ((2, 32),)
    skipped = {tuple(int(n) for n in item.split(",")) for item in args.skip.split(";") if item}
    if skipped - set(ORDER):
        raise SystemExit(f"--skip: not grid shapes: {sorted(skipped - set(ORDER))}")
    ORDER = [shape for shape in ORDER if shape not in skipped]
    ops = [op for op in PARTS[args.part] if not args.only or op in args.only.split(",")]
    grid_ops = [op for op in ops if op != "decode"]
    if args.warm_only:
        if not grid_ops:  # a worker that warms nothing would leave the tuning to the measurement
            raise SystemExit(f"--warm-only: no grid op in --part {args.part} --only {args.only}")
        warm_group(grid_ops, tuple(int(n) for n in args.warm_only.split(",")))
        return
    start = time.time()
    deadline = start + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.part == "all" else "-part" + args.part.replace("/", "of")
    path = args.out / f"{args.name}{suffix}.json"
    env = {**environment(args.commit), "part": args.part, "ops": ops}
    if args.fla_past_hopper_guard:
        env["fla_past_hopper_guard"] = fla_past_hopper_guard()
    print(json.dumps(env), flush=True)
    if args.warm and not (args.no_warm or args.tiny) and grid_ops:
        env["warm"] = warm_in_parallel(grid_ops, ORDER, args.warm_timeout_s)
        print(json.dumps({"warm": env["warm"], "s": round(time.time() - start, 1)}), flush=True)
    ceilings = measure_ceilings(DEVICE, 25, 100)
    print(json.dumps(ceilings), flush=True)
    rows: list = []

    def emit(row):
        rows.append(row)
        print(json.dumps(row), flush=True)
        path.write_text(json.dumps(record(env, ceilings, rows, time.time() - start), indent=1))

    grid_rows(grid_ops, ORDER, ceilings, deadline - DECODE_S * ("decode" in ops), emit, not args.no_default)
    if "decode" in ops:
        decode_rows(ceilings, deadline, emit)
    emit({"section": "done", "elapsed_s": time.time() - start})
    print(format_run(rows))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
