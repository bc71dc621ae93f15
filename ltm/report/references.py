"""The report's section on our kernels against fla as users install it: the kernel-grid records
of `gpu/grid_references.sh` (records/bench/references), fla with FlashQLA and TileLang beside
fla's Triton path, read by `ltm.report.records.reference_rows`."""
from __future__ import annotations

from pathlib import Path

from ltm.report.gpu import Section
from ltm.report.records import REFERENCE_PATHS, reference_rows, reference_summary

TITLE = "Kernels against fla as installed (FlashQLA, TileLang)"


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
    shown += ["fastest_fla", "x_best", "x_triton", "record"]
    # the record by its run's short name ("call2" for kernel-grid-references-...-call2.json):
    # the full names widened the table past the page's column
    rows = rows.assign(record=rows["record"].str.removesuffix(".json").str.rsplit("-", n=1).str[-1])
    devices = ", ".join(sorted(set(rows["device"])))
    versions = sorted(set(rows["versions"]))
    note = (f"Measured on {devices} (bf16, do_bench medians, one process per record) with "
            f"{'; '.join(v for v in versions if v) or 'the versions in each record'}. fla_triton: fla's Triton "
            "kernels alone (FLA_FLASH_QLA=0, FLA_TILELANG=0); fla_installed: fla as installed, "
            "its backends taking what they accept; fla_gated_g0: the plain delta rule through "
            "fla's gated entry with g = 0, the way it reaches FlashQLA. The backend columns are "
            "read from fla's dispatch log. x_best = the fastest fla path's time / ours (above 1, "
            "ours is faster); x_triton = fla's Triton path / ours. A shape measured twice counts "
            "in the summary with its worse ratio. Only the K = V = 128 shapes where FlashQLA "
            "applies and one RWKV-7 shape were measured: the rest of the grid against fla's "
            "Triton path is in the section above. record: the run's file in "
            f"{folder}, by its last word.")
    return Section(TITLE, [reference_summary(rows), rows[shown]], [], note, folded=True)
