"""ltm.report.titans_records: the Titans GPU records as two tables, and the records kept in git
read as such."""
import json
from pathlib import Path

import pandas as pd
import pytest

from ltm.report.titans_records import titans_gpu_section

RECORDS = Path(__file__).resolve().parents[2] / "records" / "gpu" / "titans"


def _write(folder: Path, name: str, record: dict) -> None:
    (folder / name).write_text(json.dumps(record))


def test_the_newest_kernel_table_worst_first_and_every_run_against_deltanet(tmp_path):
    old = {"device": "H100", "date": "2026-11-27",
           "training_tokens_per_s": {"deltanet-T2048": 400.0, "titans-linear-T2048": 100.0}}
    new = {"device": "H200", "date": "2026-11-28",
           "kernel_table": [{"shape": "1,2,3,4", "pass": "fwd", "impl": "a", "ms": 1.0, "x_delta_rule": 1.0},
                            {"shape": "1,2,3,4", "pass": "fwd", "impl": "b", "ms": 5.0, "x_delta_rule": 5.0}],
           "training_tokens_per_s": {"deltanet-T8192": {"tokens_per_s": 300},
                                     "titans-deep-T8192": {"tokens_per_s": 30},
                                     "titans-deep-T2048": {"tokens_per_s": 50}}}
    _write(tmp_path, "a.json", old)
    _write(tmp_path, "b.json", new)
    section = titans_gpu_section(tmp_path)
    kernels, training = section.tables
    assert kernels.impl.tolist() == ["b", "a"] and set(kernels.record) == {"b.json"}
    ratios = dict(zip(training.run + "@" + training.device, training["x DeltaNet"]))
    assert ratios["titans-linear-T2048@H100"] == 0.25 and ratios["titans-deep-T8192@H200"] == 0.1
    # no DeltaNet run at T2048 in the newer record: no ratio, not one from another record
    assert pd.isna(ratios["titans-deep-T2048@H200"])
    assert section.folded and not section.figures


def test_the_note_is_the_table_records_and_the_newest_days_training_notes(tmp_path):
    runs = {"deltanet-T2048": 2.0}
    _write(tmp_path, "z.json", {"device": "H100", "date": "2026-11-27", "training_tokens_per_s": runs,
                                 "note_training": "old runs"})
    _write(tmp_path, "a.json", {"device": "H200", "date": "2026-11-28", "training_tokens_per_s": runs,
                                 "kernel_table": [{"pass": "fwd", "x_delta_rule": 1.0}],
                                 "note_kernel_table": "new table", "note_training": "new runs"})
    _write(tmp_path, "b.json", {"device": "H200", "date": "2026-11-28", "training_tokens_per_s": runs,
                                 "note_training": "later runs"})
    note = titans_gpu_section(tmp_path).note
    assert "new table new runs later runs" in note and "old runs" not in note


def test_a_newer_record_replaces_only_the_rows_it_measured_again(tmp_path):
    row = {"shape": "8,2048,12,64", "pass": "fwd+bwd"}
    _write(tmp_path, "old.json", {"device": "H100", "date": "2026-12-05", "training_tokens_per_s": {},
                                   "note_kernel_table": "deep measured here",
                                   "kernel_table": [{**row, "impl": "linear", "ms": 2.6, "x_delta_rule": 2.9},
                                                    {**row, "impl": "deep", "ms": 18.0, "x_delta_rule": 20.0}]})
    _write(tmp_path, "new.json", {"device": "H100", "date": "2026-12-06", "training_tokens_per_s": {},
                                   "note_kernel_table": "linear again",
                                   "kernel_table": [{**row, "impl": "linear", "ms": 1.5, "x_delta_rule": 2.4}]})
    section = titans_gpu_section(tmp_path)
    (kernels,) = section.tables
    got = dict(zip(kernels.impl, zip(kernels.ms, kernels.record)))
    assert got == {"deep": (18.0, "old.json"), "linear": (1.5, "new.json")}
    assert "linear again deep measured here" in section.note


def test_a_failed_run_has_no_rate_and_says_why_and_a_run_its_own_setting(tmp_path):
    _write(tmp_path, "a.json", {"device": "H200", "date": "2026-11-28", "training_tokens_per_s": {
        "deltanet-T8192": {"tokens_per_s": 300}, "titans-deep-T8192": {"tokens_per_s": None,
                                                                        "error": "loss nan"},
        "titans-linear-T8192": {"tokens_per_s": 60, "note": "max step 0.2"}}})
    (training,) = titans_gpu_section(tmp_path).tables
    rows = training.set_index("run")
    failed = rows.loc["titans-deep-T8192"]
    assert pd.isna(failed["x DeltaNet"]) and pd.isna(failed["tokens/s"]) and failed.note == "loss nan"
    assert rows.loc["titans-linear-T8192", "note"] == "max step 0.2"
    assert rows.loc["titans-linear-T8192", "x DeltaNet"] == 0.2 and rows.loc["deltanet-T8192", "note"] == ""


def test_a_file_that_is_no_such_record_is_an_error_naming_it(tmp_path):
    _write(tmp_path, "bad.json", {"device": "H200"})
    with pytest.raises(ValueError, match="bad.json: not a Titans GPU record"):
        titans_gpu_section(tmp_path)


def test_the_records_in_git_make_both_tables():
    section = titans_gpu_section(RECORDS)
    kernels, training = section.tables
    assert {"titans depth 2 triton", "delta_rule triton"} <= set(kernels.impl)
    titans = training[training.run.str.startswith("titans")]
    assert (titans["x DeltaNet"].dropna() < 1).all() and len(titans["x DeltaNet"].dropna()) >= 4
