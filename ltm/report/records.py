"""Measurements made on GPUs and kept in git as JSON files, so that the CPU pipeline can still
report them: the kernel benchmarks under records/bench, the training runs under records/gpu, the
ablate protocol's runs under records/gpu/ablate."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from ltm.bench.kernel_grid import geomean, grid_table
from ltm.report.compare import git

ROOT = Path(__file__).resolve().parents[2]


def read_records(folder: str | Path, key: str, kind: str) -> list[tuple[Path, dict]]:
    """(path, record) of every JSON file in `folder`, by name. Each record holds "device" and the
    list `key`; a file that does not is an error naming it as not a `kind` record, never a
    silent gap in a table."""
    records = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            record = json.loads(path.read_text())
            record["device"], record[key]
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{path}: not a {kind} record ({err})") from None
        records.append((path, record))
    return records



def latest_grid(folder: str | Path) -> list[dict]:
    """The kernel-grid records in `folder` (`gpu/kernel_grid.py`, one file per part and run) as one
    table, op by op from the newest record that measured the op, by its "date" and then by file
    name (a later run replaces an earlier one whatever device its name gives, a cut part does not
    hide the part it did not reach): the rows of
    `ltm.bench.kernel_grid.grid_table` (one per op, B, T, H, D and pass: ours and fla in ms and over
    the floor, x_fla = fla ms / ours ms; where the record has them, the same from CUDA-graph GPU
    times, `_graph_times`) with the device, commit and file of the measurement."""
    latest: dict[str, tuple[Path, dict]] = {}
    records = read_records(folder, "rows", "kernel benchmark")
    for path, record in sorted(records, key=lambda pr: (str(pr[1].get("date", "")), pr[0].name)):
        if "grid" in record:
            latest |= {row["op"]: (path, record) for row in record["rows"]}
    rows = []
    for op, (path, record) in sorted(latest.items()):
        for row in grid_table([r for r in record["rows"] if r["op"] == op]):
            rows.append({**row, **_graph_times(record["grid"], row), "device": record["device"],
                         "commit": (record.get("commit") or "")[:7], "record": path.name,
                       "versions": ", ".join(f"{k} {v}" for k, v in
                                             record.get("versions_backends", {}).items())})
    return rows


_GRID_PASS = {"fwd": "fwd", "fwd+bwd": "fb"}  # a grid row's pass -> its key in the "grid" section


def _graph_times(grid: list[dict], row: dict) -> dict:
    """The CUDA-graph GPU times a kernel-grid record (`gpu/kernel_grid.py --graph`) holds for a
    `grid_table` row: ours and fla in ms, x_fla and ours over the floor from them. No host time is
    in them, where do_bench's times include the host's wherever it is slower than the GPU. Empty
    for a record measured without --graph."""
    key = _GRID_PASS.get(row["pass"])
    shape = [row["B"], row["T"], row["H"], row["D"]]
    entry = next((g for g in grid if g.get("op") == row["op"] and g.get("shape") == shape), None)
    if key is None or entry is None or entry.get(f"ours_{key}_graph") is None:
        return {}
    ours, fla = entry[f"ours_{key}_graph"], entry.get(f"fla_{key}_graph")
    return {"ours_graph_ms": ours, "fla_graph_ms": fla,
            "x_fla_graph": fla / ours if ours and fla else None,
            "ours_x_floor_graph": ours / row["floor_ms"] if row.get("floor_ms") else None}


def gpu_ablate_records(folder: str | Path) -> list[tuple[str, dict, pd.DataFrame]]:
    """The ablate protocol's runs on GPUs (`gpu/ablate.py OUT.json` writes OUT.json and OUT.csv,
    kept in `folder`), by file name: (name, the JSON's "protocol" (device, torch, commit, params,
    mode), the CSV's verdict table). A JSON without "protocol" or without its CSV is an error
    naming it, never a silent gap."""
    records = []
    for path in sorted(Path(folder).glob("*.json")):
        table_path = path.with_suffix(".csv")
        try:
            protocol = json.loads(path.read_text())["protocol"]
            protocol["device"]
            table = pd.read_csv(table_path)
        except (ValueError, KeyError, TypeError, FileNotFoundError) as err:
            raise ValueError(f"{path}: not a GPU ablate record with its CSV ({err})") from None
        records.append((path.stem, protocol, table))
    return records


def recorded_kernel_rows(folder: str | Path) -> pd.DataFrame:
    """The kernel benchmarks recorded on GPUs (`python -m ltm.bench.kernels --out ...`, kept in
    `folder`): one row per measurement with the device and commit it was made on. They are
    history, not this commit's metrics: the benchmark stage measures only what runs here."""
    rows = []
    for path, record in read_records(folder, "rows", "kernel benchmark"):
        for row in record["rows"]:
            rows.append({"device": record["device"], "commit": record.get("commit"),
                         "op": row["op"], "pass": row["pass"],
                         "case": f"{row['B']},{row['T']},{row['H']},{row['D']}",
                         "impl": row["impl"], "ms": row["ms"], "record": path.name})
    return pd.DataFrame(rows)


# the fla paths a references record may hold (`ltm.bench.references.REFERENCES`), in table order
REFERENCE_PATHS = ("fla_triton", "fla_installed", "fla_gated_g0")


def reference_rows(folder: str | Path) -> pd.DataFrame:
    """The kernel-grid records that timed fla as users install it (`gpu/grid_references.sh`,
    kept in `folder`): one row per measured (op, shape, pass) and record, repeats kept: ours and
    each fla path in ms with the backends it ran, the fastest path, x_best (its time over ours:
    above 1, ours is faster), x_triton (fla's Triton path over ours) and the record's package
    versions. Empty without records."""
    rows = []
    for path, record in read_records(folder, "grid", "kernel-grid references"):
        for g in record["grid"]:
            if "skipped" in g or not g.get("references"):
                continue
            for p, pass_ in (("fwd", "fwd"), ("fb", "fwd+bwd")):
                if not g.get(f"ours_{p}"):
                    continue
                row = {"op": g["op"], "shape": ",".join(map(str, g["shape"])), "pass": pass_,
                       "ours_ms": g[f"ours_{p}"], "device": record["device"],
                       "commit": (record.get("commit") or "")[:7],
                       "date": str(record.get("date", "")), "record": path.name,
                       "versions": ", ".join(f"{k} {v}" for k, v in
                                             record.get("versions_backends", {}).items())}
                for name in REFERENCE_PATHS:
                    if g.get(f"{name}_{p}"):
                        row[f"{name}_ms"] = g[f"{name}_{p}"]
                        row[f"{name}_backend"] = g.get(f"{name}_{p}_backend")
                row["fastest_fla"] = g.get(f"fla_{p}_ref")
                row["x_best"] = g[f"fla_{p}"] / g[f"ours_{p}"] if g.get(f"fla_{p}") else None
                row["x_triton"] = (g[f"fla_triton_{p}"] / g[f"ours_{p}"]
                                   if g.get(f"fla_triton_{p}") else None)
                rows.append(row)
    return pd.DataFrame(rows)


def history_rank(commits: list[str], repo: str | Path = ROOT) -> dict[str, int]:
    """Each short commit's place in the history of HEAD, 0 the newest: what tells apart records of
    one date. A commit git cannot find (a copy without history, another branch) ranks last."""
    listed = (git("rev-list", "--topo-order", "HEAD", cwd=repo) or "").split()
    place: dict[str, int] = {}
    for i, full in enumerate(listed):
        place.setdefault(full[:7], i)
    return {c: place.get(c[:7], len(listed)) for c in commits}


def reference_summary(rows: pd.DataFrame, repo: str | Path = ROOT) -> pd.DataFrame:
    """Per op and pass of `reference_rows`, one row per device and commit (our kernels change
    between commits; a ratio measured at one is not a ratio at another), newest first (by date,
    then by place in `repo`'s history): the shapes measured, the geometric mean of x_best over
    shapes (a shape measured more than once counts with its worst x_best) and the worst x_best
    with its shape, and the same against fla's Triton path alone."""
    if rows.empty:
        return pd.DataFrame()
    out = []
    rows = rows.sort_values("date", ascending=False, kind="stable")
    for (op, pass_, device, commit), group in rows.groupby(["op", "pass", "device", "commit"],
                                                           sort=False):
        worst = group.groupby("shape")[["x_best", "x_triton"]].min()
        best, triton = worst["x_best"].dropna(), worst["x_triton"].dropna()
        out.append({"op": op, "pass": pass_, "device": device, "commit": commit,
                    "date": group["date"].iloc[0], "shapes": len(worst),
                    "geomean x_best": geomean(list(best)) if len(best) else None,
                    "worst x_best": best.min() if len(best) else None,
                    "worst shape": best.idxmin() if len(best) else None,
                    "geomean x_triton": geomean(list(triton)) if len(triton) else None,
                    "worst x_triton": triton.min() if len(triton) else None})
    out = pd.DataFrame(out)
    out["rank"] = out["commit"].map(history_rank(list(out["commit"].unique()), repo))
    out = out.sort_values(["op", "pass", "date", "rank"], ascending=[True, True, False, True],
                          kind="stable", ignore_index=True)
    return out.drop(columns="rank")
