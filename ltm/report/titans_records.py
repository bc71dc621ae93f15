"""The report's section on the Titans memory measured on GPUs (`gpu/titans_deep.sh`,
`gpu/titans_triton.sh`) and kept in git as JSON under records/gpu/titans/: the kernel table per
memory depth beside our delta rule (`ltm.bench.titans_depths`), and the Titans model's training
tokens/s beside the DeltaNet model's."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ltm.report.gpu import Section
from ltm.report.records import read_records

TITLE = "Titans memory on GPUs (recorded history)"


def training_table(records: list[tuple[Path, dict]]) -> pd.DataFrame:
    """One row per training run of every record: tokens/s and, where the record also ran the
    DeltaNet model at the same length, the ratio to it (issue 56's targets: 0.7x linear, 0.5x
    deep)."""
    rows = []
    for path, record in records:
        runs = record["training_tokens_per_s"]
        for name, run in runs.items():
            tokens = run["tokens_per_s"] if isinstance(run, dict) else run
            length = name.rsplit("-", 1)[-1]  # deltanet-T2048 -> T2048
            base = runs.get(f"deltanet-{length}")
            base = base["tokens_per_s"] if isinstance(base, dict) else base
            rows.append({"run": name, "tokens/s": tokens,
                         "x DeltaNet": round(tokens / base, 3) if base else None,
                         "device": record["device"], "date": record.get("date"),
                         "record": path.name})
    return pd.DataFrame(rows)


def kernel_table(records: list[tuple[Path, dict]]) -> pd.DataFrame:
    """The newest record's kernel table (per shape, pass and implementation: ms and the ratio to
    our delta rule), worst ratio first within each pass."""
    with_table = [(path, record) for path, record in records if record.get("kernel_table")]
    if not with_table:
        return pd.DataFrame()
    path, record = max(with_table, key=lambda item: (str(item[1].get("date")), item[0].name))
    table = pd.DataFrame(record["kernel_table"])
    table["record"] = path.name
    return table.sort_values(["pass", "x_delta_rule"], ascending=[True, False], kind="stable")


def titans_gpu_section(folder: Path) -> Section:
    """Both tables, folded (history, not measurements of this commit)."""
    records = read_records(folder, "training_tokens_per_s", "Titans GPU")
    if not records:
        return Section(TITLE, [], [], f"No Titans GPU records in {folder}.")
    kernels, training = kernel_table(records), training_table(records)
    # the newest record's notes say what its tables hold and how they were measured
    _, newest = max(records, key=lambda item: (str(item[1].get("date")), item[0].name))
    notes = [newest.get(key) for key in ("note_kernel_table", "note_training")]
    note = ("The Titans memory's kernels and the Titans model's training throughput, measured with "
            "gpu/titans_deep.sh and gpu/titans_triton.sh and kept in git. "
            + " ".join(n for n in notes if n))
    tables = [t for t in (kernels, training) if not t.empty]
    return Section(TITLE, tables, [], note, folded=True)
