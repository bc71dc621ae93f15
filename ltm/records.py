"""Measurements made on GPUs and kept in git as JSON files, so that the CPU pipeline can still
report them: the kernel benchmarks under reports/bench, the training runs under reports/gpu."""
from __future__ import annotations

import json
from pathlib import Path


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
