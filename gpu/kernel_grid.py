"""Our chunked kernels against fla over a grid of shapes, on one GPU, in one call of under 9 minutes.

    python3 gpu/kernel_grid.py --out DIR [--budget-s 420] [--commit HASH] [--only delta_rule,...]
    python3 gpu/kernel_grid.py --smoke          # a CPU dry run of the bookkeeping (no timings)

What it measures (bf16 inputs as a layer feeds them, `ltm.bench.kernels.make_inputs`):
- grid: the delta rule, plain and gated, at the (B, T, H, D) of `GRID` (B x T from 8k to 64k
  tokens, T from 512 to 32k, one sequence of 32k among them, H 4..32, D 64 and 128), and RWKV-7 at
  `RWKV7_GRID`: ours and fla, forward and forward+backward. Each (op, shape) is called once
  untimed first (our compilation, fla's autotuning: its seconds are recorded as `first_s`), then
  timed as the median of `triton.testing.do_bench`. Every row has the floor of
  `ltm.bench.kernels.floor_counts` (bytes over the measured copy bandwidth, FLOPs over the
  measured bf16 matmul rate, the larger) and its ratio to it; x_fla = fla ms / our ms (above 1:
  we are faster).
- few-heads variants: the shapes where the sequential kernels leave SMs idle
  (`ltm.kernels.delta_rule.chunk._sequential_value_block`), once more with 16-wide value blocks,
  in a child process (a kernel that faults takes its CUDA context with it), with the output's
  difference from the default launch.
- decode: the one-token step kernels of both ops at batch 1..64 against the torch step
  (`ltm.ops.*.step`), with the floor of reading and writing the float32 state once.

The JSON is rewritten after every row, so a run cut at its limit keeps what it measured; the
table is printed last. Shapes are taken in `GRID` order and skipped once `--budget-s` is spent.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

# --smoke runs the kernels in Triton's interpreter, which must be chosen before they are defined
if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ltm.bench.kernels import (GRID_SHAPES, RWKV7_GRID_SHAPES, floor_counts, make_inputs,  # noqa: E402
                               measure_ceilings)

# (B, T, H, D): ltm.bench.kernels' grid (tokens B x T 8k-64k, T 512-32k, H 4..32, D 64, 128)
GRID = [tuple(s) for s in GRID_SHAPES]
RWKV7_GRID = [tuple(s) for s in RWKV7_GRID_SHAPES]
DECODE_BATCHES = (1, 4, 16, 64)
DECODE_HEADS = ((16, 64), (8, 128))
WARMUP_MS, REP_MS = 10, 60
# cuda, or cpu for --smoke (tiny shapes through Triton's interpreter: the bookkeeping, not timings)
DEVICE = torch.device("cuda")


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


def tokens_ok(shape) -> bool:
    B, T, H, D = shape
    return 8192 <= B * T <= 65536 and 512 <= T <= 32768


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
    """first_s (the untimed first call: compilation, autotuning) and the median ms of one pass."""
    grads = [t for t in x.values() if t.requires_grad]
    if backward:
        do = torch.randn_like(fn(x))
        step = lambda: fn(x).backward(do)
    else:
        step = lambda: fn(x)
    sync()
    t0 = time.perf_counter()
    with torch.enable_grad() if backward else torch.no_grad():
        step()
        sync()
        first = time.perf_counter() - t0
        ms = bench(step, WARMUP_MS, REP_MS, grads)
    return {"first_s": first, "ms": ms}


def floor_ms(op: str, shape, backward: bool, ceilings: dict) -> float:
    nbytes, flops = floor_counts(op, *shape, 2, backward)
    return 1e3 * max(nbytes / ceilings["copy_bytes_per_s"], flops / ceilings["matmul_flops_per_s"])


def grid_rows(ops, ceilings, deadline, emit):
    device = DEVICE
    for op in ops:
        shapes = RWKV7_GRID if op == "rwkv7" else GRID
        impls = {"ours": ours(op), "fla": fla(op)}
        for shape in shapes:
            if time.time() > deadline:
                emit({"section": "grid", "op": op, "shape": list(shape), "skipped": "budget spent"})
                continue
            torch.manual_seed(0)
            x = make_inputs(op, *shape, torch.bfloat16, device)
            row = {"section": "grid", "op": op, "shape": list(shape)}
            outs = {}
            for name, fn in impls.items():
                if fn is None:
                    row[f"{name}_error"] = "not installed"
                    continue
                for backward in (False, True):
                    key = f"{name}_{'fb' if backward else 'fwd'}"
                    try:
                        first = None
                        if not backward:
                            # the first call: our compilation, fla's forward autotuning
                            sync()
                            t0 = time.perf_counter()
                            with torch.no_grad():
                                outs[name] = fn(x).float()
                            sync()
                            first = time.perf_counter() - t0
                        t = time_pass(fn, x, backward)
                        row[key], row[f"{key}_first_s"] = t["ms"], first or t["first_s"]
                    except Exception as err:  # fla refuses its gated backward on Triton < 3.7.1
                        row[f"{key}_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
            for backward in (False, True):
                p = "fb" if backward else "fwd"
                row[f"floor_{p}"] = floor_ms(op, shape, backward, ceilings)
                if row.get(f"ours_{p}"):
                    row[f"x_floor_{p}"] = row[f"ours_{p}"] / row[f"floor_{p}"]
                    if row.get(f"fla_{p}"):
                        row[f"x_fla_{p}"] = row[f"fla_{p}"] / row[f"ours_{p}"]
            if "ours" in outs and "fla" in outs:
                row["rel_o_vs_fla"] = ((outs["ours"] - outs["fla"]).norm() / outs["fla"].norm()).item()
                if "fla_fb" in row:
                    row["rel_grad_vs_fla"] = grad_errors(impls, x)
            emit(row)
            del x, outs
            if DEVICE.type == "cuda":
                torch.cuda.empty_cache()


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


def few_heads_shapes() -> list:
    from ltm.kernels.delta_rule import chunk
    sms = chunk._sm_count(DEVICE)
    return [s for s in GRID if s[0] * s[2] * triton.cdiv(s[3], chunk._value_block(s[3], s[3])) < sms]


def variant_child(shapes: list, narrow: int, path: Path) -> None:
    """In a child process: ours with NARROW_VALUE_BLOCK = narrow at `shapes`, timed and compared
    with the default launch (same process, same inputs)."""
    from ltm.kernels.delta_rule import chunk
    rows = []
    for op in ("delta_rule", "gated_delta_rule"):
        fn = ours(op)
        for shape in shapes:
            torch.manual_seed(0)
            x = make_inputs(op, *shape, torch.bfloat16, DEVICE)
            chunk.NARROW_VALUE_BLOCK = None
            with torch.no_grad():
                ref = fn(x).float()
            chunk.NARROW_VALUE_BLOCK = narrow
            row = {"section": "few_heads", "op": op, "shape": list(shape), "narrow_value_block": narrow}
            try:
                with torch.no_grad():
                    out = fn(x).float()
                row["rel_o_vs_default"] = ((out - ref).norm() / ref.norm()).item()
                for backward in (False, True):
                    row[f"ours_{'fb' if backward else 'fwd'}"] = time_pass(fn, x, backward)["ms"]
            except Exception as err:
                row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
            rows.append(row)
            path.write_text(json.dumps(rows))
            print(json.dumps(row), flush=True)


def few_heads_rows(deadline, emit, grid: list) -> None:
    shapes = few_heads_shapes()
    if not shapes or time.time() > deadline:
        emit({"section": "few_heads", "skipped": "budget spent" if shapes else "no shape in the class"})
        return
    path = Path("/tmp/ltm-few-heads.json")
    path.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--child-narrow", "16", "--child-device", DEVICE.type, "--child-shapes",
           ";".join(",".join(map(str, s)) for s in shapes), "--child-out", str(path)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True,
                              timeout=max(30, deadline - time.time() + 60))
        status = f"exit {done.returncode}" + (f": {done.stderr.strip().splitlines()[-1][:200]}"
                                               if done.returncode and done.stderr.strip() else "")
    except subprocess.TimeoutExpired:
        status = "cut at the budget"
    rows = json.loads(path.read_text()) if path.exists() else []
    default = {(r["op"], tuple(r["shape"])): r for r in grid if r.get("section") == "grid"}
    for row in rows:
        base = default.get((row["op"], tuple(row["shape"])), {})
        for p in ("fwd", "fb"):
            if row.get(f"ours_{p}") and base.get(f"ours_{p}"):
                row[f"speedup_{p}"] = base[f"ours_{p}"] / row[f"ours_{p}"]
            if row.get(f"ours_{p}") and base.get(f"fla_{p}"):
                row[f"x_fla_{p}"] = base[f"fla_{p}"] / row[f"ours_{p}"]
        emit(row)
    emit({"section": "few_heads", "child": status, "shapes": [list(s) for s in shapes]})


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


def bench_rows(rows: list) -> list:
    """The grid rows as `python -m ltm.bench.kernels` records them (one row per op, impl, shape
    and pass, impl "triton" for ours), so that reports/bench keeps one format and the report's
    kernel history (`ltm.report.recorded_kernel_rows`) reads these files too."""
    out = []
    for r in rows:
        if r.get("section") != "grid" or "skipped" in r:
            continue
        B, T, H, D = r["shape"]
        for name, impl in (("ours", "triton"), ("fla", "fla")):
            for p, pass_ in (("fwd", "fwd"), ("fb", "fwd+bwd")):
                ms = r.get(f"{name}_{p}")
                row = {"op": r["op"], "impl": impl, "B": B, "T": T, "H": H, "D": D,
                       "dtype": "bfloat16", "pass": pass_, "ms": ms, "floor_ms": r[f"floor_{p}"],
                       "x_floor": ms / r[f"floor_{p}"] if ms else None,
                       "x_fla": (r.get(f"fla_{p}") / ms) if ms and r.get(f"fla_{p}") else None,
                       "first_s": r.get(f"{name}_{p}_first_s")}
                if ms is None:
                    row["error"] = r.get(f"{name}_{p}_error") or r.get(f"{name}_error")
                out.append(row)
    return out


def record(env: dict, ceilings: dict, rows: list, elapsed: float) -> dict:
    """The JSON written: the environment, "rows" in ltm.bench.kernels' format, the grid rows as
    measured (with errors against fla), the few-heads variants and the decode steps."""
    return {**env, "ceilings": ceilings, "elapsed_s": elapsed, "summary": summary(rows),
            "rows": bench_rows(rows),
            "grid": [r for r in rows if r.get("section") == "grid"],
            "few_heads": [r for r in rows if r.get("section") == "few_heads"],
            "decode": [r for r in rows if r.get("section") == "decode"]}


def summary(rows: list) -> dict:
    """Worst and geometric mean of x_fla per op and pass over the grid rows that have both."""
    out = {}
    for op in sorted({r["op"] for r in rows if r.get("section") == "grid" and "op" in r}):
        for p in ("fwd", "fb"):
            pairs = [(r[f"x_fla_{p}"], r["shape"]) for r in rows
                     if r.get("section") == "grid" and r.get("op") == op and r.get(f"x_fla_{p}")]
            if pairs:
                worst = min(pairs)
                out[f"{op}_{p}"] = {"n": len(pairs), "geomean_x_fla": math.exp(
                    sum(math.log(v) for v, _ in pairs) / len(pairs)), "worst_x_fla": worst[0],
                    "worst_shape": worst[1]}
    return out


def fmt(v, spec=".3f"):
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def table(rows: list) -> str:
    lines = [f"{'op':17} {'B,T,H,D':16} {'ours fwd':>9} {'fla fwd':>8} {'x_fla':>6} {'ours fb':>8} "
             f"{'fla fb':>8} {'x_fla':>6} {'x_floor fb':>10}"]
    for r in rows:
        if r.get("section") != "grid" or "skipped" in r:
            continue
        lines.append(f"{r['op']:17} {','.join(map(str, r['shape'])):16} {fmt(r.get('ours_fwd')):>9} "
                     f"{fmt(r.get('fla_fwd')):>8} {fmt(r.get('x_fla_fwd'), '.2f'):>6} "
                     f"{fmt(r.get('ours_fb')):>8} {fmt(r.get('fla_fb')):>8} "
                     f"{fmt(r.get('x_fla_fb'), '.2f'):>6} {fmt(r.get('x_floor_fb'), '.1f'):>10}")
    few = [r for r in rows if r.get("section") == "few_heads" and "op" in r]
    if few:
        lines.append("few heads, 16-wide value blocks (speedup over the default launch):")
        for r in few:
            lines.append(f"  {r['op']:17} {','.join(map(str, r['shape'])):16} fwd {fmt(r.get('speedup_fwd'), '.2f')} "
                         f"fb {fmt(r.get('speedup_fb'), '.2f')} x_fla fb {fmt(r.get('x_fla_fb'), '.2f')} "
                         f"rel {fmt(r.get('rel_o_vs_default'), '.1e')} {r.get('error', '')}")
    dec = [r for r in rows if r.get("section") == "decode" and "op" in r]
    if dec:
        lines.append("decode step (ms): triton / torch, floor")
        for r in dec:
            lines.append(f"  {r['op']:17} B={r['B']:<3} H={r['H']:<3} D={r['D']:<4} "
                         f"{fmt(r.get('triton_ms'), '.4f')} / {fmt(r.get('torch_ms'), '.4f')} "
                         f"x{fmt(r.get('speedup'), '.1f')} floor {fmt(r.get('floor_ms'), '.4f')}")
    for key, s in summary(rows).items():
        lines.append(f"{key}: {s['n']} shapes, geomean x_fla {s['geomean_x_fla']:.2f}, worst "
                     f"{s['worst_x_fla']:.2f} at {','.join(map(str, s['worst_shape']))}")
    return "\n".join(lines)


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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("reports/bench"))
    parser.add_argument("--name", default="kernel-grid")
    parser.add_argument("--budget-s", type=float, default=420.0)
    parser.add_argument("--commit", default=os.environ.get("LTM_COMMIT"))
    parser.add_argument("--only", default="delta_rule,gated_delta_rule,rwkv7,few_heads,decode")
    parser.add_argument("--smoke", action="store_true", help="check the grid and the table on a CPU")
    parser.add_argument("--child-narrow", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child-shapes", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-device", default="cuda", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global DEVICE, GRID, RWKV7_GRID, DECODE_BATCHES, DECODE_HEADS
    DEVICE = torch.device("cpu" if args.smoke else args.child_device)
    if args.child_narrow:
        shapes = [tuple(int(n) for n in s.split(",")) for s in args.child_shapes.split(";")]
        variant_child(shapes, args.child_narrow, args.child_out)
        return
    assert all(tokens_ok(s) for s in GRID + RWKV7_GRID), "a grid shape outside 8k-64k tokens or T 512-32k"
    if args.smoke:
        # tiny shapes in the interpreter: every section runs, the JSON and the table are written
        GRID, RWKV7_GRID = [(1, 40, 2, 32)], [(1, 20, 1, 32)]
        DECODE_BATCHES, DECODE_HEADS = (1, 2), ((2, 32),)
    start = time.time()
    deadline = start + args.budget_s
    parts = args.only.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.name}.json"
    env = environment(args.commit)
    print(json.dumps(env), flush=True)
    ceilings = measure_ceilings(DEVICE, 25, 100)
    print(json.dumps(ceilings), flush=True)
    rows: list = []

    def emit(row):
        rows.append(row)
        print(json.dumps(row), flush=True)
        path.write_text(json.dumps(record(env, ceilings, rows, time.time() - start), indent=1))

    ops = [op for op in ("delta_rule", "gated_delta_rule", "rwkv7") if op in parts]
    # the grid gets the budget less what the few-heads variants and decode need (about 90 s)
    grid_rows(ops, ceilings, deadline - 90 * ("few_heads" in parts or "decode" in parts), emit)
    if "few_heads" in parts:
        few_heads_rows(deadline - 30 * ("decode" in parts), emit, rows)
    if "decode" in parts:
        decode_rows(ceilings, deadline + 30, emit)
    emit({"section": "done", "elapsed_s": time.time() - start})
    print(table(rows))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
