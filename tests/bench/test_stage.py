import json

import pandas as pd
import pytest
import torch

from ltm.bench.stage import recorded_rows, summarise

RECORD = {"device": "Some GPU", "commit": "abc1234", "rows": [
    {"op": "delta_rule", "impl": "triton", "B": 2, "T": 63, "H": 3, "D": 32, "pass": "fwd+bwd",
     "ms": 2.0, "x_fla": 1.25},
    {"op": "delta_rule", "impl": "fla", "B": 2, "T": 63, "H": 3, "D": 32, "pass": "fwd+bwd",
     "ms": 2.5, "x_fla": 1.0}]}


def test_recorded_rows_carry_device_case_and_source(tmp_path):
    (tmp_path / "kernels-some.json").write_text(json.dumps(RECORD))
    rows = recorded_rows(tmp_path)
    assert [r["impl"] for r in rows] == ["triton", "fla"]
    assert rows[0]["group"] == "delta_rule fwd+bwd on Some GPU at abc1234 (recorded)"
    assert rows[0]["case"] == "2,63,3,32" and rows[0]["record"] == "kernels-some.json"
    assert rows[0]["commit"] == "abc1234"


def test_recorded_rows_of_an_empty_or_missing_folder_are_none(tmp_path):
    assert recorded_rows(tmp_path) == [] and recorded_rows(tmp_path / "absent") == []


def test_a_file_that_is_no_record_is_named(tmp_path):
    (tmp_path / "notes.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="notes.json: not a kernel benchmark record"):
        recorded_rows(tmp_path)


def test_summary_gives_fla_over_ours_per_recorded_case(tmp_path):
    (tmp_path / "kernels-some.json").write_text(json.dumps(RECORD))
    table = pd.DataFrame(recorded_rows(tmp_path))
    table["speedup"] = float("nan")
    summary = summarise(table, torch.device("cpu"))
    assert summary["recorded_fla_over_triton"] == {"delta_rule fwd+bwd on Some GPU at abc1234 (recorded) 2,63,3,32": 1.25}
