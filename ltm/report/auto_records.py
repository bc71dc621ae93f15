"""The report's section on `model.kernel: auto` measured on GPUs (`gpu/auto.sh`) and kept in git as
JSON under records/gpu/auto/: the kernel table auto chose from (per op, pass and shape class, each
implementation's ms and the winner) and the training tokens/s of each implementation and of auto
beside them."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ltm.report.gpu import Section
from ltm.report.records import read_records

TITLE = "kernel: auto on GPUs (recorded history)"


def choice_table(records: list[tuple[Path, dict]]) -> pd.DataFrame:
    """One row per kernel-table entry of every record: the class, each implementation's total ms
    over the entry's shapes ("error" where it failed) and the implementation auto takes there."""
    rows = []
    for path, record in records:
        for entry in record.get("kernel_table", {}).get("entries", []):
            errors = entry.get("errors", {})
            times = {column: "error" if column in errors else
                     (None if None in ms else round(sum(ms), 3))
                     for column, ms in entry["ms"].items()}
            rows.append({"op": entry["op"], "pass": entry["pass"], "D": entry["D"],
                         "T": entry["T"], "BH/SM": entry["bh_per_sm"], **times,
                         "auto takes": entry["winner"], "device": record["device"],
                         "record": path.name})
    return pd.DataFrame(rows)


def training_table(records: list[tuple[Path, dict]]) -> pd.DataFrame:
    """One row per training run: the kernel, the shape, tokens/s and the ratio to ours."""
    rows = [{key: row[key] for key in ("mixer", "kernel", "heads", "B", "T", "tokens_per_s",
                                        "x_triton")}
            | {"device": record["device"], "commit": record.get("commit"), "record": path.name}
            for path, record in records for row in record["rows"]]
    return pd.DataFrame(rows)


def auto_gpu_section(folder: Path) -> Section:
    """Both tables, folded (history, not measurements of this commit); the notes of the records."""
    records = read_records(folder, "rows", "kernel auto")  # a missing folder holds none
    if not records:
        return Section(TITLE, [], [], f"No kernel-auto records in {folder}.")
    tables = [t for t in (choice_table(records), training_table(records)) if not t.empty]
    note = ("model.kernel auto takes, per op and shape class, the implementation a measured table "
            "names fastest (gpu/auto.sh measures it, then trains with each). "
            + " ".join(record["note"] for _, record in records if record.get("note")))
    return Section(TITLE, tables, [], note, folded=True)
