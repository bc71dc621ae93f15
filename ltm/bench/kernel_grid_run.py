"""The kernel grid's measurement (gpu/kernel_grid.py is its command): our chunked kernels against
fla per (op, shape), forward and forward+backward, tuned and on default configurations, with the
floor and the errors against fla; the one-token decode steps against the torch step; the parallel
warm-up of Triton's cache; and the JSON record. The tables and the summary of the measured rows
are `ltm.bench.kernel_grid`'s; the why of each choice is in gpu/kernel_grid.py's docstring.
The caller picks the device (`Grid.device`: cuda, or cpu under Triton's interpreter for the
bookkeeping-only dry run, whose TRITON_INTERPRET must be set before this module is imported).
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import triton

from ltm.bench import timing
from ltm.bench.kernel_grid import as_bench_rows, format_run, run_summary
from ltm.bench.kernels import GRID_SHAPES, floor_ms, make_inputs, measure_ceilings
from ltm.bench.references import (add_errors, backend_label, dispatches, entry, installed_backends,
                                  references, switched)
from ltm.kernels import tuning
from ltm.kernels.delta_rule import triton_chunk_delta_rule, triton_delta_rule_step
from ltm.kernels.rwkv7 import triton_chunk_rwkv7, triton_rwkv7_step
from ltm.ops.delta_rule.step import delta_rule_step
from ltm.ops.rwkv7.step import rwkv7_step

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
# --tiny: tiny shapes through Triton's interpreter on the CPU (the bookkeeping, not timings)
TINY_ORDER = [(1, 70, 2, 32), (2, 20, 1, 64)]
TINY_DECODE = ((1, 2), ((2, 32),))


@dataclasses.dataclass
class Grid:
    """Where and how a run measures: the device (cpu only for the interpreter's dry run), whether
    each pass is also replayed from a CUDA graph (the GPU's time without the host's), and the
    decode steps' batches and (H, D) heads, and which fla paths are timed (None: every one
    `ltm.bench.references.references` names; a name list saves the others' autotuning)."""
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cuda"))
    graph: bool = False
    paths: tuple | None = None
    decode_batches: tuple = DECODE_BATCHES
    decode_heads: tuple = DECODE_HEADS

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def bench(self, fn: Callable, warmup: int, rep: int, grads: list | None = None) -> float:
        """Median ms of fn: triton.testing.do_bench on the GPU (`warmup`, `rep` in ms), the host
        clock over three calls on the CPU."""
        if self.device.type == "cuda":
            return timing.gpu_ms(fn, warmup_ms=warmup, rep_ms=rep, grad_to_none=grads)
        return timing.host_ms(fn, 3, warmup=0)


def check_order() -> None:
    """ORDER is the grid reordered, every shape 8k-64k tokens with T 512-32k."""
    assert all(8192 <= B * T <= 65536 and 512 <= T <= 32768 for B, T, _, _ in ORDER), \
        "a grid shape outside 8k-64k tokens or T 512-32k"
    assert sorted(ORDER) == sorted(tuple(s) for s in GRID_SHAPES), "ORDER must be the grid, reordered"


def ours(op: str) -> Callable:
    """Our chunked kernel of op, on make_inputs' dict, returning o."""
    if op == "rwkv7":
        return lambda x: triton_chunk_rwkv7(x["r"], x["w"], x["k"], x["v"], x["a"], x["b"])[0]
    return lambda x: triton_chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], x.get("g"))[0]


def time_pass(grid: Grid, fn: Callable, x: dict, backward: bool) -> dict:
    """first_s (the untimed first call: compilation, tuning) and the median ms of one pass;
    graph_ms too with `grid.graph` on a GPU."""
    grads = [t for t in x.values() if t.requires_grad]
    with torch.enable_grad() if backward else torch.no_grad():
        output_grad = {}  # the backward's do, drawn in the first pass and reused by the timed ones

        def first_pass() -> None:
            out = fn(x)
            if backward:
                output_grad["do"] = torch.randn_like(out)
                out.backward(output_grad["do"])
        first = timing.first_call_s(first_pass, sync=grid.sync)
        do = output_grad.get("do")
        step = (lambda: fn(x).backward(do)) if backward else (lambda: fn(x))
        result = {"first_s": first, "ms": grid.bench(step, WARMUP_MS, REP_MS, grads)}
        if grid.graph and grid.device.type == "cuda":
            result["graph_ms"] = graph_ms(fn, x, backward, do)
    return result


def graph_ms(fn: Callable, x: dict, backward: bool, do: torch.Tensor | None) -> float:
    """The median ms of one pass replayed from a CUDA graph. Fresh leaves on the same storage and
    autograd.grad: the timed .backward() calls before left AccumulateGrad nodes made on the
    default stream, and capturing a backward through them failed (H100, torch 2.11: "operation
    failed due to a previous error during capture"); nothing accumulates into .grad here."""
    leaves = {n: t.detach().requires_grad_(t.requires_grad) for n, t in x.items()}
    inputs = [t for t in leaves.values() if t.requires_grad]
    graphed = ((lambda: torch.autograd.grad(fn(leaves), inputs, do)) if backward
               else (lambda: fn(leaves)))
    return timing.graph_ms(graphed, rep_ms=REP_MS)


def error_text(err: Exception) -> str:
    """An exception as one short line for a row."""
    return f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"


def measure(grid: Grid, fn: Callable, x: dict, key: str, row: dict, switches: dict | None = None,
            ) -> None:
    """row[key_fwd], row[key_fb] (ms) and their first calls' seconds; errors as strings. With
    `switches` (an fla reference's, `ltm.bench.references`): each pass runs under them, and
    row[key_pass_backend] says which backends fla dispatched to in it."""
    for backward in (False, True):
        name = f"{key}_{'fb' if backward else 'fwd'}"
        with switched(switches or {}), dispatches() as log:
            try:
                t = time_pass(grid, fn, x, backward)
                row[name], row[f"{name}_first_s"] = t["ms"], t["first_s"]
                if "graph_ms" in t:
                    row[f"{name}_graph"] = t["graph_ms"]
            except Exception as err:  # fla refuses its gated backward on Hopper with Triton < 3.7.1
                row[f"{name}_error"] = error_text(err)
        if switches is not None:
            row[f"{name}_backend"] = backend_label(log.ran)
            if log.rejected:
                row[f"{name}_rejected"] = sorted(log.rejected)


def measure_references(grid: Grid, op: str, x: dict, row: dict) -> dict:
    """Every fla path of op (`ltm.bench.references.references`), each pass under its switches,
    then fla_fwd / fla_fb: the fastest of them, named in fla_*_ref with the backends it ran.
    Returns name -> (function, switches) of the paths that could be imported."""
    paths = {}
    for ref in references(op):
        if grid.paths is not None and ref.name not in grid.paths:
            continue
        fn = entry(ref.entry)
        if fn is None:
            row[f"{ref.name}_error"] = "not installed"
            continue
        paths[ref.name] = (fn, ref.switches)
        measure(grid, fn, x, ref.name, row, ref.switches)
    row["references"] = list(paths)
    for p in ("fwd", "fb"):
        times = [(row[f"{name}_{p}"], name) for name in paths if row.get(f"{name}_{p}")]
        if times:
            ms, name = min(times)
            row[f"fla_{p}"], row[f"fla_{p}_ref"] = ms, f"{name} ({row[f'{name}_{p}_backend']})"
            if row.get(f"{name}_{p}_graph"):
                row[f"fla_{p}_graph"] = row[f"{name}_{p}_graph"]
        elif paths:
            row[f"fla_{p}_error"] = next(row[f"{n}_{p}_error"] for n in paths if f"{n}_{p}_error" in row)
    return paths


def grid_row(grid: Grid, op: str, shape: tuple, ceilings: dict, with_default: bool) -> dict:
    """One (op, shape): ours tuned (with the configurations it took), ours on default
    configurations if asked, every fla path (the fastest as fla_*), the floors and the ratios,
    and the errors against each fla path."""
    torch.manual_seed(0)
    x = make_inputs(op, *shape, torch.bfloat16, grid.device)
    row = {"section": "grid", "op": op, "shape": list(shape)}
    mine = ours(op)
    before = {(r["kernel"], tuple(r["class"])) for r in tuning.chosen()}
    measure(grid, mine, x, "ours", row)
    row["ours_configs"] = {r["kernel"]: r["best"] for r in tuning.chosen()
                           if (r["kernel"], tuple(r["class"])) not in before}
    if with_default:
        # "ours" above ran tuned when LTM_AUTOTUNE=1 (the library's default is off: see
        # ltm.kernels.tuning); "default" is the untuned launch either way
        tuning.AUTOTUNE, autotune = False, tuning.AUTOTUNE
        try:
            measure(grid, mine, x, "default", row)
        finally:
            tuning.AUTOTUNE = autotune
    paths = measure_references(grid, op, x, row)
    if not paths:
        row["fla_error"] = "not installed"
    add_ratios(row, op, shape, ceilings)
    if row.get("ours_fwd"):
        add_errors(mine, paths, x, row)
    del x
    if grid.device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def add_ratios(row: dict, op: str, shape: tuple, ceilings: dict) -> None:
    """The floors of both passes and the ratios of a measured row: x_floor, x_fla, tuned_gain,
    and their CUDA-graph forms where the row has graph times."""
    for p in ("fwd", "fb"):
        row[f"floor_{p}"] = floor_ms(op, *shape, 2, p == "fb", ceilings)
        if row.get(f"ours_{p}"):
            row[f"x_floor_{p}"] = row[f"ours_{p}"] / row[f"floor_{p}"]
            if row.get(f"fla_{p}"):
                row[f"x_fla_{p}"] = row[f"fla_{p}"] / row[f"ours_{p}"]
            for name in row.get("references", ()):
                if row.get(f"{name}_{p}"):
                    row[f"x_{name}_{p}"] = row[f"{name}_{p}"] / row[f"ours_{p}"]
            if row.get(f"default_{p}"):
                row[f"tuned_gain_{p}"] = row[f"default_{p}"] / row[f"ours_{p}"]
        if row.get(f"ours_{p}_graph") and row.get(f"fla_{p}_graph"):
            row[f"x_fla_{p}_graph"] = row[f"fla_{p}_graph"] / row[f"ours_{p}_graph"]
            row[f"x_floor_{p}_graph"] = row[f"ours_{p}_graph"] / row[f"floor_{p}"]


def grid_rows(grid: Grid, ops: list, shapes: list, ceilings: dict, deadline: float,
              emit: Callable, with_default: bool) -> None:
    """Shapes outer, ops inner: the plain and gated delta rule share a shape's tuning."""
    for shape in shapes:
        for op in ops:
            if time.time() > deadline:
                emit({"section": "grid", "op": op, "shape": list(shape), "skipped": "budget spent"})
                continue
            emit(grid_row(grid, op, shape, ceilings, with_default))


def head_groups(shapes: list) -> dict:
    """(H, D) -> the first shape with those heads: fla's autotuning and our kernels' compilation
    are keyed on H and D (never on B or T), so one shape per group warms the whole group."""
    groups: dict = {}
    for shape in shapes:
        groups.setdefault(tuple(shape[2:]), tuple(shape))
    return groups


def warm_group(grid: Grid, ops: list, shape: tuple) -> None:
    """Run ours and fla once, forward and forward+backward, for each op at `shape`: the
    compilation and autotuning of the head group, untimed (errors are the measuring run's)."""
    for op in ops:
        torch.manual_seed(0)
        x = make_inputs(op, *shape, torch.bfloat16, grid.device)
        runs = [(ours(op), {})] + [(entry(ref.entry), ref.switches) for ref in references(op)
                                   if grid.paths is None or ref.name in grid.paths]
        for fn, switches in runs:
            if fn is None:
                continue
            for backward in (False, True):
                try:
                    with switched(switches), torch.enable_grad() if backward else torch.no_grad():
                        out = fn(x)
                        if backward:
                            out.backward(torch.randn_like(out))
                except Exception:
                    pass
        del x
    grid.sync()


def warm_in_parallel(script: str, ops: list, shapes: list, timeout_s: float,
                     extra_args: tuple = ()) -> dict:
    """One `script --warm-only H,D` process per head group, all at once, FLA_CACHE_RESULTS=0 (see
    gpu/kernel_grid.py's docstring), each given `extra_args` too (the measurement's --paths, so a
    worker warms only the fla paths it will time); returns each group's exit code and seconds."""
    env = {**os.environ, "FLA_CACHE_RESULTS": "0"}
    procs = {}
    for (H, D), shape in head_groups(shapes).items():
        # --part all: the worker's default part would filter RWKV-7 out of --only
        cmd = [sys.executable, script, "--warm-only", ",".join(map(str, shape)),
               "--part", "all", "--only", ",".join(ops), *extra_args]
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


def decode_inputs(grid: Grid, B: int, H: int, D: int) -> tuple:
    """The float32 state and the step arguments of the gated delta rule and of RWKV-7."""
    dev = grid.device
    torch.manual_seed(0)
    rnd = lambda *s: torch.randn(*s, device=dev, dtype=torch.bfloat16)
    state = torch.randn(B, H, D, D, device=dev)
    kk = torch.nn.functional.normalize(torch.randn(B, H, D, device=dev), dim=-1)
    dr = (rnd(B, H, D), kk.bfloat16(), rnd(B, H, D), torch.rand(B, H, device=dev).bfloat16(),
          -torch.rand(B, H, device=dev))
    rw = (rnd(B, H, D), -torch.rand(B, H, D, device=dev).bfloat16(), rnd(B, H, D), rnd(B, H, D),
          (-kk).bfloat16(), (kk * 0.5).bfloat16())
    return state, dr, rw


def decode_rows(grid: Grid, ceilings: dict, deadline: float, emit: Callable) -> None:
    """The one-token step kernels against the torch step per batch and heads, with the floor of
    reading and writing the float32 state once and the state's error against torch."""
    for (H, D), B in ((hd, b) for hd in grid.decode_heads for b in grid.decode_batches):
        if time.time() > deadline:
            emit({"section": "decode", "B": B, "H": H, "D": D, "skipped": "budget spent"})
            continue
        state, dr, rw = decode_inputs(grid, B, H, D)
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
                    row[f"{name}_ms"] = grid.bench(call, 5, 25)
                except Exception as err:
                    row[f"{name}_error"] = error_text(err)
            _, s_t = triton_fn(*args, state=state)
            _, s_r = torch_fn(*args, state=state)
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
    """Device, versions (fla's, None without it: optional, so imported here), commit, date and
    do_bench's settings, recorded with every run."""
    try:
        import fla
        fla_version = getattr(fla, "__version__", "present")
    except ImportError:
        fla_version = None
    return {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "triton": triton.__version__, "fla": fla_version,
            "fla_backends_installed": installed_backends(),
            "commit": commit, "date": time.strftime("%Y-%m-%d"), "dtype": "bfloat16",
            "do_bench": {"warmup_ms": WARMUP_MS, "rep_ms": REP_MS, "return_mode": "median"}}


def fla_past_hopper_guard() -> bool:
    """Lift fla's refusal of the gated backward (chunk_bwd_dqkwg) on Hopper with Triton >= 3.4
    and < 3.7.1: its Triton kernel then runs, so that its time can be compared; fla says its
    results may be incorrect there, so the grid's error columns are the check. True if lifted.
    fla is optional: imported here."""
    try:
        from fla.ops.common import chunk_o
    except ImportError:
        return False
    chunk_o.TRITON_ABOVE_3_7_1 = True
    return True


def run(grid: Grid, ops: list, shapes: list, path: Path, env: dict, budget_s: float,
        with_default: bool, warm: Callable | None = None) -> list:
    """A whole part: the warm-up (if given: it returns what to record under "warm"), the
    ceilings, the grid rows then the decode steps within the budget (decode keeps DECODE_S at
    the end), each row printed and the JSON at `path` rewritten after it; returns the rows."""
    start = time.time()
    deadline = start + budget_s
    print(json.dumps(env), flush=True)
    grid_ops = [op for op in ops if op != "decode"]
    if warm is not None and grid_ops:
        env["warm"] = warm(grid_ops)
        print(json.dumps({"warm": env["warm"], "s": round(time.time() - start, 1)}), flush=True)
    ceilings = measure_ceilings(grid.device, 25, 100)
    print(json.dumps(ceilings), flush=True)
    rows: list = []

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        path.write_text(json.dumps(record(env, ceilings, rows, time.time() - start), indent=1))

    grid_rows(grid, grid_ops, shapes, ceilings, deadline - DECODE_S * ("decode" in ops), emit,
              with_default)
    if "decode" in ops:
        decode_rows(grid, ceilings, deadline, emit)
    emit({"section": "done", "elapsed_s": time.time() - start})
    print(format_run(rows))
    return rows
