"""The kernel grid's tables: ours paired with fla per op, shape and pass, the summary's geometric
mean and worst shape, the grid's shapes over the issue's ranges."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ltm.bench.kernel_grid import (as_bench_rows, format_grid, format_run, geomean, grid_summary,
                                  grid_table, run_summary)
from ltm.bench.kernels import GRID_SHAPES, RWKV7_GRID_SHAPES


def test_grid_covers_the_issue_ranges_and_its_table_pairs_ours_with_fla():
    for B, T, H, D in GRID_SHAPES + RWKV7_GRID_SHAPES:
        assert 8192 <= B * T <= 65536 and 512 <= T <= 32768 and 4 <= H <= 32 and D in (64, 128)
    assert {D for *_, D in GRID_SHAPES} == {64, 128} and any(B == 1 and T == 32768 for B, T, _, _ in GRID_SHAPES)
    base = {"op": "delta_rule", "B": 1, "T": 512, "H": 4, "D": 64, "pass": "fwd", "floor_ms": 0.5}
    rows = [dict(base, impl="triton", ms=2.0, x_floor=4.0), dict(base, impl="fla", ms=3.0, x_floor=6.0),
            dict(base, impl="sdpa", ms=1.0, x_floor=2.0),
            dict(base, impl="triton", ms=4.0, x_floor=8.0, **{"pass": "fwd+bwd"}),
            dict(base, impl="fla", ms=None, x_floor=None, error="refused", **{"pass": "fwd+bwd"})]
    table = grid_table(rows)
    assert len(table) == 2
    fwd, fb = table
    assert fwd["x_fla"] == pytest.approx(1.5) and fwd["ours_x_floor"] == 4.0 and fwd["fla_x_floor"] == 6.0
    assert fb["x_fla"] is None and fb["fla_error"] == "refused"
    text = format_grid(table)
    assert "geometric mean x_fla 1.50, worst 1.50 at 1,512,4,64" in text


def test_summary_takes_the_geometric_mean_and_the_worst_shape():
    def row(B, ours, fla):
        return {"op": "delta_rule", "B": B, "T": 512, "H": 4, "D": 64, "pass": "fwd", "floor_ms": 0.1,
                "ours_ms": ours, "fla_ms": fla, "ours_x_floor": ours / 0.1, "x_fla": fla / ours}
    (summary,) = grid_summary([row(1, 1.0, 4.0), row(2, 2.0, 2.0), row(4, 1.0, 2.0)])
    assert summary["shapes"] == 3 and summary["with_fla"] == 3
    assert summary["geomean_x_fla"] == pytest.approx(2.0) and geomean([4.0, 1.0, 2.0]) == pytest.approx(2.0)
    assert summary["worst_x_fla"] == 1.0 and summary["worst_shape"] == "2,512,4,64"
    assert summary["worst_ours_x_floor"] == pytest.approx(20.0)


def measured_row(shape, ours_fwd, fla_fwd, ours_fb, fla_fb, **extra):
    """A row as gpu/kernel_grid.py measures it (floors 0.5 ms forward, 1 ms forward+backward)."""
    return {"section": "grid", "op": "delta_rule", "shape": list(shape),
            "ours_fwd": ours_fwd, "fla_fwd": fla_fwd, "x_fla_fwd": fla_fwd / ours_fwd,
            "floor_fwd": 0.5, "x_floor_fwd": ours_fwd / 0.5,
            "ours_fb": ours_fb, "fla_fb": fla_fb, "x_fla_fb": fla_fb / ours_fb if fla_fb else None,
            "floor_fb": 1.0, "x_floor_fb": ours_fb / 1.0, **extra}


def test_a_grid_run_is_summarised_recorded_and_printed():
    rows = [measured_row((1, 512, 4, 64), 1.0, 4.0, 2.0, 4.0, x_fla_fwd_graph=2.0),
            measured_row((2, 512, 4, 64), 2.0, 2.0, 4.0, None, x_fla_fwd_graph=0.5),
            {"section": "grid", "op": "delta_rule", "shape": [4, 512, 4, 64], "skipped": "budget"},
            {"section": "decode", "op": "rwkv7", "B": 1, "H": 8, "D": 128, "triton_ms": 0.01,
             "torch_ms": 0.1, "speedup": 10.0, "floor_ms": 0.001}]
    summary = run_summary(rows)
    fwd, fb = summary["delta_rule_fwd"], summary["delta_rule_fb"]
    assert fwd["n"] == 2 and fwd["geomean_x_fla"] == pytest.approx(2.0)  # sqrt(4 x 1)
    assert (fwd["worst_x_fla"], fwd["worst_shape"]) == (1.0, [2, 512, 4, 64])
    assert (fwd["worst_x_floor"], fwd["worst_floor_shape"]) == (4.0, [2, 512, 4, 64])
    assert fwd["geomean_x_fla_graph"] == pytest.approx(1.0) and fwd["worst_x_fla_graph"] == 0.5
    assert fb["n"] == 1 and fb["worst_x_fla"] == 2.0  # fla's missing time leaves its shape out
    bench = as_bench_rows(rows)  # 2 shapes x (ours, fla) x 2 passes; the skipped shape has none
    assert len(bench) == 8 and {r["impl"] for r in bench} == {"triton", "fla"}
    ours_fwd = next(r for r in bench if r["impl"] == "triton" and r["pass"] == "fwd" and r["B"] == 1)
    assert (ours_fwd["ms"], ours_fwd["x_floor"], ours_fwd["x_fla"]) == (1.0, 2.0, 4.0)
    text = format_run(rows)
    assert "skipped (budget): 1" in text and "x10.0" in text
    assert "delta_rule_fwd: 2 shapes, geomean x_fla 2.00, worst 1.00 at 2,512,4,64" in text


def test_the_grid_script_runs_its_bookkeeping_on_the_cpu(tmp_path):
    # gpu/kernel_grid.py --tiny: tiny shapes through Triton's interpreter, no fla; what a GPU call
    # would write, so that a broken script shows here rather than on the lent GPU
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(root / "gpu" / "kernel_grid.py"), "--tiny", "--part",
                           "1/2", "--only", "delta_rule", "--out", str(tmp_path), "--budget-s", "60"],
                          capture_output=True, text=True, timeout=600, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / "kernel-grid-part1of2.json").read_text())
    grid = [r for r in record["grid"] if "skipped" not in r]
    assert grid and all(r["op"] == "delta_rule" and r["ours_fwd"] > 0 and r["ours_fb"] > 0 for r in grid)
    assert record["summary"]["delta_rule_fwd"]["n"] == 0  # no fla here: no ratio to report
    assert {r["impl"] for r in record["rows"]} == {"triton", "fla"}


def test_the_grid_script_names_an_unknown_fla_path_in_one_line(tmp_path):
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(root / "gpu" / "kernel_grid.py"), "--tiny", "--paths",
                           "fla_instaled", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=root)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "--paths: unknown ['fla_instaled']" in done.stderr and "fla_installed" in done.stderr


def test_the_parallel_warm_up_workers_get_the_measurements_fla_paths(tmp_path, monkeypatch):
    # --warm with --paths: each worker warms only the fla paths the measurement will time (it had
    # autotuned every path, minutes a head group, for nothing)
    import importlib.util

    from ltm.bench import kernel_grid_run as kg
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("kernel_grid_script",
                                                  root / "gpu" / "kernel_grid.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    commands = []

    class Worker:
        def __init__(self, cmd, **_):
            commands.append(cmd)

        def wait(self, timeout):
            return 0
    monkeypatch.setattr(kg.subprocess, "Popen", Worker)
    monkeypatch.setattr(kg, "environment", lambda commit: {})
    monkeypatch.setattr(kg, "run", lambda grid, ops, order, path, env, budget, default, warm:
                        warm(ops))
    script.main(["--warm", "--paths", "fla_installed", "--part", "1/2", "--only",
                 "gated_delta_rule", "--shapes", "8,2048,8,128;2,8192,4,64",
                 "--out", str(tmp_path)])
    assert len(commands) == 2  # one worker per head group
    for cmd in commands:
        assert cmd[cmd.index("--paths") + 1] == "fla_installed"
        assert cmd[cmd.index("--only") + 1] == "gated_delta_rule"
