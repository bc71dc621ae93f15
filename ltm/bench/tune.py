"""The table of `model.kernel: auto` (ltm/ops/auto.py): each candidate implementation timed per op,
shape and pass on this GPU, or read from the kernel grid's GPU records.

    python -m ltm.bench.kernels --tune [--out PATH] [--shapes "B,T,H,D;..."] [--ops delta_rule,rwkv7,titans]
    python -m ltm.bench.tune --from-records OUT.json --sm-count 132 RECORD.json ...

--tune times, through the ops' entry points (what auto dispatches to), forward and
forward+backward in bfloat16: ours ("triton"), fla on its Triton path ("fla_triton": fla's
backend switches off around both passes) and, where flash-qla or tilelang is installed and
switched on, fla as installed ("fla_installed"); for the Titans memory, the only call where fla
computes its function (the linear memory, chunk size 1, no clipping), fla against the chunked
PyTorch form ("torch"), ours not computing that function. ltm's "delta_rule" is the gated delta
rule the layers call. Each time is `ltm.bench.kernels`' (do_bench's median after one untimed call,
which compiles ours and runs fla's autotuning); a candidate that fails (fla refuses its gated
backward on Hopper with Triton < 3.7.1) is recorded with its error and never chosen.

--from-records builds the shipped tables from gpu/kernel_grid.py records: their "grid" rows,
ours and fla per (op, shape), forward ("fwd") and forward+backward ("fb"). A record timed by
gpu/grid_references.sh names each fla path (fla_triton, fla_installed); an older one timed fla
with no backend installed, i.e. its Triton path. Records later on the command line replace
earlier ones shape by shape, so that each shape's times come from one run.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from ltm.bench import kernels as bench
from ltm.bench.provenance import ROOT, commit, version_of
from ltm.bench.references import TRITON_PATH, switched
from ltm.ops.auto import (COLUMNS, TABLE_VERSION, check_table, dtype_name, enabled_backends,
                          fastest, fla_installed, shape_class, to_json)
from ltm.ops.delta_rule import delta_rule
from ltm.ops.rwkv7 import rwkv7
from ltm.ops.titans import titans_memory

TUNE_OPS = ("delta_rule", "rwkv7")
OPS = TUNE_OPS + ("titans",)
# ltm's op -> the op of ltm.bench.kernels.make_inputs whose inputs feed it
INPUTS = {"delta_rule": "gated_delta_rule", "rwkv7": "rwkv7", "titans": "titans"}
# the kernel grid's op names -> ltm's (its plain "delta_rule" rows are the ungated rule, which
# no layer calls and fla's gated entry does not compute)
RECORD_OPS = {"gated_delta_rule": "delta_rule", "rwkv7": "rwkv7"}
PASS_OF = {"fwd": "inference", "fb": "training"}
# (fn on make_inputs' dict -> o, fla's backend switches while it runs)
Candidate = tuple[Callable[[dict], torch.Tensor], dict]
# ms of one pass of fn on the inputs (training: forward + backward)
Timer = Callable[[Callable, dict, bool], float]


def entry(op: str, kernel: str) -> Callable[[dict], torch.Tensor]:
    """ltm's entry point of op under `kernel`, on make_inputs' dict, returning o."""
    if op == "delta_rule":
        return lambda x: delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"], kernel=kernel,
                                    chunk_size=64)[0]
    if op == "rwkv7":
        return lambda x: rwkv7(x["r"], x["w"], x["k"], x["v"], x["a"], x["b"], kernel=kernel,
                               chunk_size=16)[0]
    # the Titans memory in fla's exact case: the linear memory, chunk size 1, no clipping
    return lambda x: titans_memory(x["q"], x["k"], x["v"], x["theta"], x["alpha"], x["eta"],
                                   [x["w"]], kernel=kernel, chunk_size=1, grad_clip=None)[0]


def candidates(op: str) -> dict[str, Candidate]:
    """Table column -> what runs it, for the columns that can run in this process."""
    ours = ("torch", entry(op, "torch")) if op == "titans" else ("triton", entry(op, "triton"))
    found = {ours[0]: (ours[1], {})}
    if fla_installed():
        found["fla_triton"] = (entry(op, "fla"), TRITON_PATH)
        if enabled_backends():
            found["fla_installed"] = (entry(op, "fla"), {})
    return found


def do_bench_timer(device: torch.device) -> Timer:
    """`ltm.bench.kernels`' timing of one pass: do_bench's median after one untimed call, which
    compiles ours and runs fla's autotuning."""
    cfg = bench.KernelBenchConfig()
    return lambda fn, x, training: bench._time_one(fn, x, device, training, cfg)["ms"]


def measure_shape(op: str, shape: list[int], found: dict[str, Candidate], timer: Timer,
                  device: torch.device, dtype: torch.dtype) -> list[dict]:
    """One row per column and pass at one shape (`ltm.bench.kernels.make_inputs`' inputs): ms, or
    None and the error's first line."""
    torch.manual_seed(0)
    x = bench.make_inputs(INPUTS[op], *shape, dtype, device)
    rows = []
    for column, (fn, switches) in found.items():
        for training in (False, True):
            row = {"op": op, "column": column, "shape": list(shape), "dtype": dtype_name(dtype),
                   "pass": "training" if training else "inference"}
            # the switches hold over the backward too: fla reads them at every dispatch
            with switched(switches):
                try:
                    row["ms"] = timer(fn, x, training)
                except Exception as err:  # an implementation refusing these inputs is not chosen
                    row["ms"], row["error"] = None, f"{type(err).__name__}: " + (
                        str(err).splitlines() or [""])[0][:200]
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def build_table(rows: list[dict], env: dict) -> dict:
    """The table (ltm/ops/auto.py's format) of measured rows ({op, column, shape, dtype, pass,
    ms[, error, source]}), grouped by shape class at env["sm_count"]; `env` holds the rest of the
    header (device, versions, fla_backends, commit, date, ...)."""
    by_class: dict[tuple, dict] = {}
    for row in rows:
        B, T, H, D = row["shape"]
        cls = shape_class(row["op"], B, T, H, D, getattr(torch, row["dtype"]),
                          training=row["pass"] == "training", sm_count=env["sm_count"])
        found = by_class.setdefault(tuple(cls.values()), {"class": cls, "shapes": {}, "errors": {}})
        at = found["shapes"].setdefault(tuple(row["shape"]),
                                        {"ms": {}, "source": row.get("source")})
        # do_bench's medians to 0.1 us
        at["ms"][row["column"]] = None if row["ms"] is None else round(row["ms"], 4)
        if row.get("error"):
            found["errors"].setdefault(row["column"], row["error"])
    return check_table({"version": TABLE_VERSION, **env,
                        "entries": [_entry(found) for found in by_class.values()]}, "tune")


def _entry(found: dict) -> dict:
    """One table entry: the class, its shapes, each column's ms per shape, the winner."""
    shapes = list(found["shapes"])
    columns = [c for c in COLUMNS if any(c in at["ms"] for at in found["shapes"].values())]
    ms = {c: [found["shapes"][s]["ms"].get(c) for s in shapes] for c in columns}
    entry = {**found["class"], "shapes": [list(s) for s in shapes], "ms": ms,
             "winner": fastest(ms, [c for c in columns if c not in found["errors"]])}
    sources = [found["shapes"][s]["source"] for s in shapes]
    if any(sources):
        entry["sources"] = sources
    if found["errors"]:
        entry["errors"] = found["errors"]
    return entry


def environment(device: torch.device, command: str) -> dict:
    """The table's header for a measurement on this GPU."""
    return {"device": torch.cuda.get_device_name(device),
            "sm_count": torch.cuda.get_device_properties(device).multi_processor_count,
            "torch": torch.__version__, "triton": version_of("triton"),
            "fla": version_of("fla"), "fla_backends": enabled_backends(),
            "commit": commit(short=True), "date": time.strftime("%Y-%m-%d"), "dtype": "bfloat16",
            "command": command}


def tune(ops: list[str], shapes: list[list[int]], out: Path, env: dict, timer: Timer,
         device: torch.device) -> dict:
    """Measure every candidate of each op at each shape in bfloat16, rewriting the table at `out`
    (header `env`, see `environment`) after each (op, shape) so that a run cut short keeps what
    it measured; returns the table."""
    print(json.dumps(env), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows, table = [], {}
    for op in ops:
        found = candidates(op)
        for shape in shapes:
            rows += measure_shape(op, shape, found, timer, device, torch.bfloat16)
            table = build_table(rows, env)
            out.write_text(to_json(table))
    print(format_table(table))
    print(f"wrote {out}")
    return table


def command(ops: str | None, shapes: str | None, out: Path | None) -> dict:
    """`python -m ltm.bench.kernels --tune`: --ops (ltm's ops, default TUNE_OPS), --shapes
    ("B,T,H,D;...", default the benchmark's GPU_SHAPES), --out (default
    gpu/results/kernel-table.json); a one-line exit for bad ops or a machine without CUDA."""
    ops_list = (ops or ",".join(TUNE_OPS)).split(",")
    if any(op not in OPS for op in ops_list):
        raise SystemExit(f"kernels --tune: --ops must be of {','.join(OPS)}, got {ops}")
    if not torch.cuda.is_available():
        raise SystemExit("kernels --tune: needs a CUDA GPU (auto chooses among GPU "
                         "implementations; on a CPU it always runs the torch form)")
    shape_list = ([[int(n) for n in s.split(",")] for s in shapes.split(";") if s] if shapes
                  else bench.GPU_SHAPES)
    device = torch.device("cuda")
    env = environment(device, "python -m ltm.bench.kernels " + " ".join(sys.argv[1:]))
    return tune(ops_list, shape_list, out or Path("gpu/results/kernel-table.json"), env,
                do_bench_timer(device), device)


def format_table(table: dict) -> str:
    """One line per entry: its class, each column's total ms over the shapes where every column
    that ran was measured (those the winner was decided on; "-": none), "error" for a column that
    failed, and the winner."""
    lines = [f"{table.get('device')}: kernel table, {len(table.get('entries', []))} entries"]
    for e in table.get("entries", []):
        ms, n, errors = e["ms"], len(e["shapes"]), e.get("errors", {})
        ran = [c for c in ms if c not in errors]
        common = [i for i in range(n) if all(ms[c][i] is not None for c in ran)]
        times = ", ".join(f"{c} error" if c in errors else
                          f"{c} {sum(ms[c][i] for i in common):.3f}" if common else f"{c} -"
                          for c in ms)
        lines.append(f"{e['op']:10} {e['pass']:9} D{e['D']:<4} T{e['T']:8} BH/SM "
                     f"{e['bh_per_sm']:7} {times} ({len(common)} of {n} shapes) -> {e['winner']}")
    return "\n".join(lines)


def record_rows(path: Path) -> list[dict]:
    """A gpu/kernel_grid.py record's grid rows as measured rows (column names of the table)."""
    record = json.loads(path.read_text())
    rows = []
    for r in record.get("grid", []):
        if "skipped" in r or r.get("op") not in RECORD_OPS:
            continue
        paths = r.get("references")
        # a record without named fla paths timed fla with no backend installed: its Triton path
        keys = {"triton": "ours", **({name: name for name in ("fla_triton", "fla_installed")
                                      if name in paths} if paths else {"fla_triton": "fla"})}
        for column, key in keys.items():
            for p, pass_kind in PASS_OF.items():
                rows.append({"op": RECORD_OPS[r["op"]], "column": column, "shape": r["shape"],
                             "dtype": record.get("dtype", "bfloat16"), "pass": pass_kind,
                             "ms": r.get(f"{key}_{p}"), "error": r.get(f"{key}_{p}_error"),
                             "source": path.name})
    return rows


def latest_per_shape(rows: list[dict]) -> list[dict]:
    """Rows of the last source to measure each (op, pass, shape): all of a shape's columns from
    one run."""
    last = {(r["op"], r["pass"], tuple(r["shape"])): r["source"] for r in rows}
    return [r for r in rows if last[(r["op"], r["pass"], tuple(r["shape"]))] == r["source"]]


def _relative(path: Path) -> str:
    """A record's path from the repository root where it is inside it."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def added_in(path: Path) -> str | None:
    """The commit that added a record file to the repository (None outside git)."""
    done = subprocess.run(["git", "-C", str(ROOT), "log", "--diff-filter=A", "--format=%h", "--",
                           str(path.resolve())], capture_output=True, text=True)
    return (done.stdout.split() or [None])[-1]


def table_from_records(paths: list[Path], sm_count: int, command: str, note: str = "") -> dict:
    """The table the records measured (one device, the versions of the first), every source
    named with the commit it measured and the commit that added it."""
    records = [json.loads(p.read_text()) for p in paths]
    devices = {r["device"] for r in records}
    if len(devices) != 1:
        raise SystemExit(f"--from-records: records of several devices: {sorted(devices)}")
    installed = [r.get("fla_backends_installed") or {} for r in records]
    backends = sorted({name for found in installed for name, present in found.items() if present})
    sources = [{"file": _relative(p),
                "commit": r.get("commit"), "date": r.get("date"), "added_in": added_in(p)}
               for p, r in zip(paths, records)]
    first = records[0]
    env = {"device": first["device"], "sm_count": sm_count, "torch": first.get("torch"),
           "triton": first.get("triton"), "fla": first.get("fla"), "fla_backends": backends,
           # the commits the sources measured (each source names its own)
           "commit": ", ".join(dict.fromkeys(str(r.get("commit")) for r in records)),
           "date": time.strftime("%Y-%m-%d"), "dtype": first.get("dtype"),
           "command": command, "sources": sources, "note": note}
    rows = latest_per_shape([row for p in paths for row in record_rows(p)])
    return build_table(rows, env)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A kernel table for model.kernel auto from "
                                                 "gpu/kernel_grid.py records")
    parser.add_argument("--from-records", type=Path, required=True, metavar="OUT.json")
    parser.add_argument("--sm-count", type=int, required=True,
                        help="the device's streaming multiprocessors (the records do not say)")
    parser.add_argument("--note", default="")
    parser.add_argument("records", type=Path, nargs="+")
    args = parser.parse_args(argv)
    command = " ".join(["python -m ltm.bench.tune --from-records", str(args.from_records),
                        "--sm-count", str(args.sm_count), "--note NOTE", *map(str, args.records)])
    table = table_from_records(args.records, args.sm_count, command, args.note)
    args.from_records.write_text(to_json(table))
    print(format_table(table))
    print(f"wrote {args.from_records}")


if __name__ == "__main__":
    main()
