"""ltm.report.auto_records: the kernel-auto GPU records as a choice table and a training table, and
the records kept in git read as such."""
import json
from pathlib import Path

import pytest

from ltm.report.auto_records import auto_gpu_section

RECORDS = Path(__file__).resolve().parents[2] / "records" / "gpu" / "auto"


def _record(**extra) -> dict:
    entry = {"op": "delta_rule", "pass": "training", "D": 128, "T": "<=2048", "bh_per_sm": "<0.25",
             "ms": {"triton": [1.0, 2.0], "fla_triton": [None, None], "fla_installed": [1.5, None]},
             "winner": "triton", "errors": {"fla_triton": "RuntimeError: refused"}}
    rows = [{"mixer": "deltanet", "kernel": kernel, "heads": 6, "B": 8, "T": 2048,
             "tokens_per_s": rate, "x_triton": rate / 200.0, "ms_per_step": 1.0}
            for kernel, rate in (("triton", 200.0), ("fla", 100.0), ("auto", 199.0))]
    return {"device": "H200", "commit": "abc", "kernel_table": {"entries": [entry]}, "rows": rows,
            **extra}


def test_the_choices_show_errors_and_gaps_and_every_run_its_ratio(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(_record(note="one call")))
    section = auto_gpu_section(tmp_path)
    choices, training = section.tables
    (choice,) = choices.to_dict("records")
    # a column measured at one shape of two has no total: it cannot be compared with the others
    assert (choice["triton"], choice["fla_triton"], choice["fla_installed"]) == (3.0, "error", None)
    assert choice["auto takes"] == "triton"
    assert dict(zip(training.kernel, training.x_triton)) == {"triton": 1.0, "fla": 0.5, "auto": 0.995}
    assert section.folded and section.note.endswith("one call")


def test_a_file_that_is_no_such_record_is_an_error_naming_it(tmp_path):
    (tmp_path / "bad.json").write_text(json.dumps({"device": "H200"}))
    with pytest.raises(ValueError, match="bad.json: not a kernel auto record"):
        auto_gpu_section(tmp_path)


def test_no_folder_is_a_section_that_says_so(tmp_path):
    section = auto_gpu_section(tmp_path / "none")
    assert not section.tables and "No kernel-auto records" in section.note


def test_the_records_in_git_make_both_tables():
    choices, training = auto_gpu_section(RECORDS).tables
    assert set(choices["auto takes"]) <= {"triton", "fla_triton", "fla_installed"}
    assert {"triton", "fla", "auto"} <= set(training.kernel)
