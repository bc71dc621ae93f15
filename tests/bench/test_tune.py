"""The table of `model.kernel: auto` (ltm/bench/tune.py): a tuning run on the CPU with a fake
timer (rows, classes, errors, the fla switches held over both passes, the file auto reads back),
the shipped tables rebuilt from their records, and the one-line exits of `--tune` on a CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from ltm.bench import kernels as bench
from ltm.bench import tune
from ltm.ops import auto

ROOT = auto.TABLE_DIR.parents[2]


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    for name in (auto.TABLE_ENV, *auto.FLA_BACKENDS.values()):
        monkeypatch.delenv(name, raising=False)
    auto.forget()
    yield
    auto.forget()


# ms by column and pass (inference, training): fla as installed fastest in training, ours in
# inference; fla's Triton path fails its backward, as fla's Hopper guard makes it
FAKE_MS = {"triton": (1.0, 4.0), "fla_triton": (2.0, None), "fla_installed": (1.5, 3.0)}


def test_a_tuning_run_writes_the_table_auto_reads(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tune, "fla_installed", lambda: True)
    monkeypatch.setattr(tune, "enabled_backends", lambda: ["flash_qla"])
    found = tune.candidates("delta_rule")
    assert list(found) == ["triton", "fla_triton", "fla_installed"]
    # each candidate's function names its column, so the fake timer knows what it times
    monkeypatch.setattr(tune, "candidates", lambda op: {
        column: ((lambda x, column=column: column), switches)
        for column, (_, switches) in found.items()})
    seen = []

    def timer(fn, x, training):
        column = fn(x)
        seen.append((column, training, os.environ.get("FLA_FLASH_QLA")))
        if FAKE_MS[column][training] is None:
            raise RuntimeError("refused on Hopper\nsecond line")
        return FAKE_MS[column][training]

    env = {"device": "Test GPU", "sm_count": 100, "fla_backends": ["flash_qla"], "commit": "abc"}
    out = tmp_path / "table.json"
    table = tune.tune(["delta_rule"], [[8, 48, 4, 16], [1, 48, 4, 16]], out, env, timer,
                      torch.device("cpu"))
    # fla's Triton path ran with FlashQLA switched off, in both passes; the others as installed
    assert sorted(set(seen)) == sorted((c, t, "0" if c == "fla_triton" else None)
                                       for c in FAKE_MS for t in (False, True))
    assert len(seen) == 2 * 2 * 3
    by_class = {(e["pass"], e["bh_per_sm"]): e for e in table["entries"]}
    training = by_class[("training", "0.25-1")]
    assert training["shapes"] == [[8, 48, 4, 16]] and training["T"] == "<=512"
    assert training["ms"] == {"triton": [4.0], "fla_triton": [None], "fla_installed": [3.0]}
    assert training["winner"] == "fla_installed"
    assert training["errors"] == {"fla_triton": "RuntimeError: refused on Hopper"}
    assert by_class[("inference", "<0.25")]["winner"] == "triton"
    assert auto.read_table(out) == table
    # the printed line shows the times the winner was decided on, the failed column as such
    printed = capsys.readouterr().out
    assert ("triton 4.000, fla_triton error, fla_installed 3.000 (1 of 1 shapes) -> fla_installed"
            in printed)
    # auto, on that device with fla and FlashQLA on, runs fla where it won
    monkeypatch.setenv(auto.TABLE_ENV, str(out))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Test GPU")
    monkeypatch.setattr(auto, "_multiprocessors", lambda index: 100)
    monkeypatch.setattr(auto, "fla_installed", lambda: True)
    monkeypatch.setattr(auto, "enabled_backends", lambda: ["flash_qla"])
    pick = lambda T, training: auto.resolve("delta_rule", 8, T, 4, 16, torch.bfloat16,
                                            torch.device("cuda"), training=training,
                                            candidates=("triton", "fla"))
    # T = 5000 is a class the run did not measure
    assert (pick(48, True), pick(48, False), pick(5000, True)) == ("fla", "triton", "triton")


def test_measure_shape_times_the_entry_points_on_the_benchmark_inputs(monkeypatch):
    """Real candidates on the CPU (ours through Triton's interpreter is too slow here: the timer
    runs the torch form in its place) and the inputs of ltm.bench.kernels.make_inputs."""
    calls = []

    def timer(fn, x, training):
        calls.append((sorted(x), training))
        return 1.0

    found = {"torch": (tune.entry("delta_rule", "torch"), {})}
    rows = tune.measure_shape("delta_rule", [1, 9, 2, 8], found, timer, torch.device("cpu"),
                              torch.float32)
    assert [r["pass"] for r in rows] == ["inference", "training"]
    assert calls[0][0] == sorted(bench.make_inputs("gated_delta_rule", 1, 2, 1, 4, torch.float32,
                                                   "cpu"))
    x = bench.make_inputs("rwkv7", 1, 5, 1, 4, torch.float64, "cpu")
    assert tune.entry("rwkv7", "torch")(x).shape == (1, 5, 1, 4)
    x = bench.make_inputs("titans", 1, 5, 1, 4, torch.float64, "cpu")
    assert tune.entry("titans", "torch")(x).shape == (1, 5, 1, 4)


def test_candidates_without_fla_are_ours_alone_and_titans_is_torch_against_fla(monkeypatch):
    monkeypatch.setattr(tune, "fla_installed", lambda: False)
    assert list(tune.candidates("rwkv7")) == ["triton"]
    monkeypatch.setattr(tune, "fla_installed", lambda: True)
    monkeypatch.setattr(tune, "enabled_backends", lambda: [])
    assert list(tune.candidates("titans")) == ["torch", "fla_triton"]


@pytest.mark.parametrize("name, records", [
    ("h100", ["kernel-grid-part2-h100-2026-11-24-s10.json", "kernel-grid-part1-h100-2026-11-26-s19.json",
              *(f"references/kernel-grid-references-h100-2026-11-27-call{i}.json" for i in (2, 3, 6, 7))]),
    ("h200", ["kernel-grid-part1-h200-2026-11-25-s16.json"]),
])
def test_the_shipped_tables_are_what_their_records_measured(name, records):
    paths = [ROOT / "records" / "bench" / r for r in records]
    shipped = auto.read_table(auto.TABLE_DIR / f"{name}.json")
    rebuilt = tune.table_from_records(paths, 132, shipped["command"], shipped["note"])
    assert rebuilt["entries"] == shipped["entries"]
    assert [s["file"] for s in shipped["sources"]] == [f"records/bench/{r}" for r in records]
    assert [s["commit"] for s in rebuilt["sources"]] == [s["commit"] for s in shipped["sources"]]


def test_a_later_record_replaces_a_shape_with_all_its_columns():
    rows = [{"op": "delta_rule", "pass": "training", "shape": [1, 2, 3, 4], "source": "a",
             "column": c} for c in ("triton", "fla_triton")]
    rows += [{"op": "delta_rule", "pass": "training", "shape": [1, 2, 3, 4], "source": "b",
              "column": "triton"}]
    assert [r["source"] for r in tune.latest_per_shape(rows)] == ["b"]


@pytest.mark.parametrize("args, message", [
    (["--tune"], "kernels --tune: needs a CUDA GPU"),
    (["--tune", "--ops", "mamba"], "kernels --tune: --ops must be of delta_rule,rwkv7,titans"),
])
def test_tune_on_a_cpu_exits_with_one_line(args, message):
    if torch.cuda.is_available() and "mamba" not in args:
        pytest.skip("a GPU is here")
    done = subprocess.run([sys.executable, "-m", "ltm.bench.kernels", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 1 and done.stderr.startswith(message)
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_the_benchmark_stage_never_loads_the_tuner():
    """ltm.bench.kernels reaches ltm.bench.tune by name, on --tune only: the benchmark stage,
    which imports it, runs exactly its dvc.yaml deps."""
    done = subprocess.run([sys.executable, "-c", "import sys, ltm.bench.kernels; "
                           "print('ltm.bench.tune' in sys.modules)"], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert done.stdout.strip() == "False", done.stderr
    assert json.loads(auto.to_json({"a": [1.0, None, 2e-05]})) == {"a": [1.0, None, 2e-05]}
