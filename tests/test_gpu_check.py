"""gpu/check.py on a CPU-sized model: every case a row, a broken case a FAIL row beside the
passing ones (not a stop), the record written with device, versions and commit."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "gpu" / "check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_broken_case_is_a_row_and_the_others_still_run(tmp_path, capsys):
    check = load_check()
    # titans_depth 3 has no Triton kernel: titans fails its config check, deltanet still trains
    rc = check.main(["--tiny", "--no-tests", "--only", "deltanet,titans", "--modes", "eager",
                     "--no-latent", "--steps", "2", "--out", str(tmp_path),
                     "--set", "model.titans_depth=3"])
    record = json.loads((tmp_path / "check.json").read_text())
    rows = {row["case"]: row for row in record["rows"]}
    assert rc == 1
    assert rows["deltanet eager"]["ok"] and rows["deltanet eager"]["generation"] == "ok"
    assert not rows["titans eager"]["ok"] and "titans_depth 1" in rows["titans eager"]["error"]
    assert {"device", "versions", "commit", "command"} <= set(record)
    table = capsys.readouterr().out
    assert "1 of 2 cases passed; 1 FAILED" in table


def test_an_unknown_mixer_is_one_line():
    with pytest.raises(SystemExit, match="unknown mixer 'deltanett'"):
        load_check().main(["--tiny", "--only", "deltanett"])


def test_test_outcomes_count_each_file_and_name_the_first_failure():
    log = ("[gw1] [ 10%] PASSED tests/kernels/test_kernels_titans.py::test_a[bf16]\n"
           "tests/ops/test_rwkv7.py::test_b FAILED                      [ 20%]\n"
           "[gw0] [ 30%] FAILED tests/ops/test_rwkv7.py::test_c[16-fp32]\n"
           "[gw0] [ 40%] SKIPPED tests/ops/test_rwkv7.py::test_d\n")
    files = load_check().test_outcomes(log)
    assert files["test_kernels_titans"] == {"passed": 1, "failed": 0, "skipped": 0,
                                            "first_failure": None}
    assert files["test_rwkv7"] == {"passed": 0, "failed": 2, "skipped": 1,
                                   "first_failure": "test_b"}


def test_kernel_tests_become_rows_and_a_cut_run_says_so():
    check = load_check()
    check.KERNEL_TESTS = ["tests/test_docs.py"]  # a quick file stands in for the GPU's tests
    rows = check.kernel_test_rows(300, 1)
    assert [r["case"] for r in rows] == ["tests test_docs"] and rows[0]["ok"]
    assert rows[0]["detail"].endswith("0 failed, 0 skipped")
    cut = check.kernel_test_rows(0, 1)
    assert cut[-1]["case"] == "kernel tests" and not cut[-1]["ok"] and "cut at 0 s" in cut[-1]["error"]
