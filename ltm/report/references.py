"""The report's section on our kernels against fla as users install it: the kernel-grid records
of `gpu/grid_references.sh` (records/bench/references), fla with FlashQLA and TileLang beside
fla's Triton path, read by `ltm.report.records.reference_rows`."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from ltm.bench.tune import RECORD_OPS
from ltm.ops.auto import fastest, shape_class, table_for
from ltm.report.gpu import Section
from ltm.report.records import REFERENCE_PATHS, reference_rows, reference_summary

TITLE = "Kernels against fla as installed (FlashQLA, TileLang)"


def auto_pick(op: str, shape: str, pass_: str, device: str) -> str | None:
    """What `model.kernel: auto` runs for the grid's op at this shape ("B,T,H,D") and pass on
    `device`, with fla's backends installed as the device's shipped table measured them: "ours"
    or "fla_installed" (ours where the table has no entry for the class, as auto does); None for
    an op no layer calls (the grid's ungated delta rule: ltm's delta_rule is the gated one)."""
    if op not in RECORD_OPS:
        return None
    table, _ = table_for(device)
    if table is None:
        return "ours"
    B, T, H, D = map(int, shape.split(","))
    key = shape_class(RECORD_OPS[op], B, T, H, D, torch.bfloat16, training=pass_ == "fwd+bwd",
                      sm_count=table["sm_count"])
    entry = next((e for e in table["entries"] if all(e.get(k) == v for k, v in key.items())),
                 None)
    if entry is None:
        return "ours"
    columns = [c for c in ("triton", "fla_installed") if c not in entry.get("errors", {})]
    return "fla_installed" if fastest(entry["ms"], columns) == "fla_installed" else "ours"


def with_auto(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` with auto's pick per row, its time (the picked implementation's in the same record)
    and auto_x_best = auto's time over the fastest measured path (1 = auto took the fastest)."""
    picks, auto_ms = [], []
    for _, r in rows.iterrows():
        pick = auto_pick(r["op"], r["shape"], r["pass"], r["device"])
        picks.append(pick)
        picked_ms = r["ours_ms"] if pick == "ours" else r.get("fla_installed_ms")
        auto_ms.append(picked_ms if pick else None)
    times = rows[["ours_ms"] + [f"{n}_ms" for n in REFERENCE_PATHS if f"{n}_ms" in rows]]
    out = rows.assign(auto=picks, auto_ms=auto_ms)
    return out.assign(auto_x_best=out["auto_ms"] / times.min(axis=1))


def kernel_references_section(folder: Path) -> Section:
    """Per op and pass the geometric mean and the worst ratio over the shapes measured, then
    every measurement: ours and each fla path in ms with the backends each ran."""
    rows = reference_rows(folder)
    if rows.empty:
        return Section(TITLE, [], [], f"No kernel-grid records with fla's backends in {folder}.",
                       folded=True)
    shown = ["op", "shape", "pass", "ours_ms"]
    for name in REFERENCE_PATHS:
        if f"{name}_ms" in rows:
            # fla_triton's backend is triton by construction: its column only widened the table
            shown += [f"{name}_ms"] + ([f"{name}_backend"] if name != "fla_triton" else [])
    shown += ["fastest_fla", "x_best", "x_triton", "auto", "auto_ms", "auto_x_best", "commit",
              "record"]
    # worst shape first: within each op and pass, the lowest x_best leads
    rows = with_auto(rows).sort_values(["op", "pass", "x_best"], kind="stable")
    # the record by its run's short name ("call2" for kernel-grid-references-...-call2.json):
    # the full names widened the table past the page's column
    rows = rows.assign(record=rows["record"].str.removesuffix(".json").str.rsplit("-", n=1).str[-1])
    devices = ", ".join(sorted(set(rows["device"])))
    versions = sorted(set(rows["versions"]))
    note = (f"Measured on {devices} (bf16, do_bench medians, one process per record) with "
            f"{'; '.join(v for v in versions if v) or 'the versions in each record'}. "
            "fla_triton: fla's Triton kernels alone (FLA_FLASH_QLA=0, FLA_TILELANG=0); "
            "fla_installed: fla as installed, its backends taking what they accept; fla_gated_g0: "
            "the plain delta rule through fla's gated entry with g = 0, the way it reaches "
            "FlashQLA. The backend columns are read from fla's dispatch log. x_best = the fastest "
            "fla path's time / ours (above 1, ours is faster); x_triton = fla's Triton path / "
            "ours. auto = what `model.kernel: auto` runs at that shape by the device's shipped "
            "table (ltm/ops/auto_tables; ours where it has no entry for the class; blank for the "
            "ungated delta rule, which no layer calls), timed as that implementation in the same "
            "record, not run as auto; auto_x_best = its time over the fastest path (1 = auto "
            "took the fastest; where the device's table was built from these records, its "
            "sources, 1 checks the table's shape classes, not auto run). Rows: worst x_best "
            "first in each op and pass. The summary has a row per device and commit, newest "
            "first (our kernels change between commits); a shape measured twice there counts "
            "with its worse ratio. Only the K = V = 128 shapes where FlashQLA applies and one "
            "RWKV-7 shape were measured: the rest of the grid against fla's Triton path is in "
            f"the section above. record: the run's file in {folder}, by its last word.")
    summary = reference_summary(rows).merge(
        rows.groupby(["op", "pass", "device", "commit"], sort=False)["auto_x_best"].max()
        .rename("worst auto_x_best").reset_index(), on=["op", "pass", "device", "commit"],
        how="left")
    return Section(TITLE, [summary, rows[shown]], [], note, folded=True)
