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
    deep); a run that failed has no tokens/s and says why in `note`, where a run that needed a
    setting of its own says which."""
    rows = []
    for path, record in records:
        runs = record["training_tokens_per_s"]
        for name, run in runs.items():
            tokens = run["tokens_per_s"] if isinstance(run, dict) else run
            length = name.rsplit("-", 1)[-1]  # deltanet-T2048 -> T2048
            base = runs.get(f"deltanet-{length}")
            base = base["tokens_per_s"] if isinstance(base, dict) else base
            rows.append({"run": name, "tokens/s": tokens,
                         "x DeltaNet": round(tokens / base, 3) if tokens and base else None,
                         "note": (run.get("error") or run.get("note") or "")
                         if isinstance(run, dict) else "",
                         "device": record["device"], "date": record.get("date"),
                         "record": path.name})
    table = pd.DataFrame(rows)
    return table if table.empty or table.note.any() else table.drop(columns="note")


def _with_table_newest_first(records: list[tuple[Path, dict]]) -> list[tuple[Path, dict]]:
    with_table = [(path, record) for path, record in records if record.get("kernel_table")]
    return sorted(with_table, key=lambda item: (str(item[1].get("date")), item[0].name),
                  reverse=True)


def kernel_table(records: list[tuple[Path, dict]]) -> pd.DataFrame:
    """Per shape, pass and implementation, the newest record's row (ms and the ratio to our
    delta rule measured in the same call as it; `record` says which), worst ratio first within
    each pass: a call that re-measured some rows (the linear memory per chunk size) leaves the
    others (the deep memory) as last measured."""
    tables = []
    for path, record in _with_table_newest_first(records):
        table = pd.DataFrame(record["kernel_table"])
        tables.append(table.assign(record=path.name))
    if not tables:
        return pd.DataFrame()
    merged = pd.concat(tables, ignore_index=True)
    keys = [k for k in ("shape", "pass", "impl") if k in merged]
    merged = merged.drop_duplicates(keys, keep="first")
    return merged.sort_values(["pass", "x_delta_rule"], ascending=[True, False], kind="stable")


def _notes(records: list[tuple[Path, dict]], kernels: pd.DataFrame) -> list[str]:
    """The notes of the records the kernel table's rows come from (newest first), then the
    training notes of every record of the newest date (a day's calls may leave several
    records), in name order."""
    shown = set(kernels["record"]) if "record" in kernels else set()
    notes = [record.get("note_kernel_table") for path, record in _with_table_newest_first(records)
             if path.name in shown]
    last = max(str(record.get("date")) for _, record in records)
    notes += [record.get("note_training") for _, record in sorted(records, key=lambda r: r[0].name)
              if str(record.get("date")) == last]
    return [n for n in notes if n]


def titans_gpu_section(folder: Path) -> Section:
    """Both tables, folded (history, not measurements of this commit)."""
    records = read_records(folder, "training_tokens_per_s", "Titans GPU")
    if not records:
        return Section(TITLE, [], [], f"No Titans GPU records in {folder}.")
    kernels, training = kernel_table(records), training_table(records)
    # the newest records' notes say what their tables hold and how they were measured
    note = ("The Titans memory's kernels and the Titans model's training throughput, measured with "
            "gpu/titans_deep.sh and gpu/titans_triton.sh and kept in git. "
            + " ".join(_notes(records, kernels)))
    tables = [t for t in (kernels, training) if not t.empty]
    return Section(TITLE, tables, [], note, folded=True)
