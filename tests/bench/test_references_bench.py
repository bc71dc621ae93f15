"""ltm.bench.references: fla's backend switches set and restored, the backends a call ran read
from fla's dispatch log, and the grid's fastest-path bookkeeping (with stand-ins for fla, which
the CPU lacks)."""
import logging
import os

import pytest
import torch

from ltm.bench import kernel_grid_run as kg
from ltm.bench import references as refs
from ltm.bench.kernel_grid import as_bench_rows, grid_summary, grid_table


def test_switches_are_set_inside_the_block_and_restored_after(monkeypatch):
    monkeypatch.setenv("FLA_TILELANG", "1")
    monkeypatch.delenv("FLA_FLASH_QLA", raising=False)
    with refs.switched(refs.TRITON_PATH):
        assert os.environ["FLA_TILELANG"] == "0" and os.environ["FLA_FLASH_QLA"] == "0"
    assert os.environ["FLA_TILELANG"] == "1" and "FLA_FLASH_QLA" not in os.environ
    with pytest.raises(RuntimeError), refs.switched(refs.TRITON_PATH):
        raise RuntimeError("a failing call still restores the switches")
    assert os.environ["FLA_TILELANG"] == "1" and "FLA_FLASH_QLA" not in os.environ


def test_the_dispatch_log_keeps_the_backends_that_ran_not_those_rejected():
    logger = logging.getLogger("fla.backends")
    with refs.dispatches() as log:
        logger.info("[FLA Backend] gated_delta_rule.chunk_gated_delta_rule -> flash_qla")
        logger.info("[FLA Backend] common.chunk_bwd_dv -> tilelang rejected: K=64")
        logger.info("something else")
        logging.getLogger("fla.utils").info("[FLA Backend] TileLang is installed but no usable nvcc")
    logger.info("[FLA Backend] rwkv7.chunk -> tilelang")  # after the block: not collected
    assert log.ran == {"gated_delta_rule.chunk_gated_delta_rule -> flash_qla"}
    assert log.rejected == {"common.chunk_bwd_dv -> tilelang rejected: K=64",
                            "TileLang is installed but no usable nvcc"}
    assert refs.backend_label(log.ran) == "flash_qla"
    assert refs.backend_label(set()) == "triton"
    assert refs.backend_label({"a.f -> tilelang", "b.g -> flash_qla"}) == "flash_qla+tilelang"


def test_without_a_backend_package_the_installed_path_is_not_timed_twice(monkeypatch):
    monkeypatch.setattr(refs, "installed_backends", lambda: {"flash_qla": False, "tilelang": False})
    assert [r.name for r in refs.references("gated_delta_rule")] == ["fla_triton"]
    assert [r.name for r in refs.references("delta_rule")] == ["fla_triton", "fla_gated_g0"]
    monkeypatch.setattr(refs, "installed_backends", lambda: {"flash_qla": True, "tilelang": False})
    assert [r.name for r in refs.references("rwkv7")] == ["fla_triton", "fla_installed"]
    assert all(r.switches == refs.TRITON_PATH for r in refs.references("rwkv7")[:1])


def _stand_in(x: dict) -> torch.Tensor:
    """fla as its dispatcher behaves: the gated entry goes to flash_qla unless switched off."""
    if os.environ.get("FLA_FLASH_QLA", "1") != "0":
        logging.getLogger("fla.backends").info("[FLA Backend] gated_delta_rule.chunk -> flash_qla")
    return x["q"] * 2.0


def test_the_grid_row_takes_the_fastest_path_and_names_its_backend(monkeypatch):
    monkeypatch.setattr(kg, "references", lambda op: refs.REFERENCES["gated_delta_rule"])
    monkeypatch.setattr(kg, "entry", lambda name: _stand_in)
    # fla_triton 3 ms, fla_installed 1 ms forward; both 4 ms forward+backward
    times = iter([3.0, 4.0, 1.0, 4.0])
    monkeypatch.setattr(kg.Grid, "bench", lambda self, fn, warmup, rep, grads=None: next(times))
    grid = kg.Grid(torch.device("cpu"))
    x = {"q": torch.randn(2, 3, requires_grad=True)}
    row = {"section": "grid", "op": "gated_delta_rule", "shape": [1, 3, 1, 2], "ours_fwd": 2.0,
           "ours_fb": 2.0}
    kg.measure_references(grid, "gated_delta_rule", x, row)
    assert row["references"] == ["fla_triton", "fla_installed"]
    assert row["fla_triton_fwd_backend"] == "triton" and row["fla_installed_fwd_backend"] == "flash_qla"
    assert row["fla_fwd"] == 1.0 and row["fla_fwd_ref"] == "fla_installed (flash_qla)"
    assert row["fla_fb"] == 4.0 and row["fla_fb_ref"].startswith("fla_")
    kg.add_ratios(row, "gated_delta_rule", (1, 3, 1, 2), {"copy_bytes_per_s": 1e12, "matmul_flops_per_s": 1e14})
    assert row["x_fla_fwd"] == 0.5 and row["x_fla_triton_fwd"] == 1.5
    bench = as_bench_rows([row])
    assert {r["impl"] for r in bench} == {"triton", "fla", "fla_triton"}
    fla_fwd = next(r for r in bench if r["impl"] == "fla" and r["pass"] == "fwd")
    assert fla_fwd["ref"] == "fla_installed (flash_qla)"
    table = grid_table(bench)
    fwd = next(t for t in table if t["pass"] == "fwd")
    assert fwd["x_fla"] == pytest.approx(0.5) and fwd["x_fla_triton"] == pytest.approx(1.5)
    assert fwd["fla_ref"] == "fla_installed (flash_qla)"
    summary = next(s for s in grid_summary(table) if s["pass"] == "fwd")
    assert summary["worst_x_fla"] == pytest.approx(0.5)
    assert summary["geomean_x_fla_triton"] == pytest.approx(1.5)


def test_a_grid_limited_to_some_paths_times_only_those(monkeypatch):
    # Grid.paths (gpu/kernel_grid.py --paths): fla_triton left out is neither timed nor named
    monkeypatch.setattr(kg, "references", lambda op: refs.REFERENCES["gated_delta_rule"])
    monkeypatch.setattr(kg, "entry", lambda name: _stand_in)
    times = iter([1.0, 4.0])
    monkeypatch.setattr(kg.Grid, "bench", lambda self, fn, warmup, rep, grads=None: next(times))
    grid = kg.Grid(torch.device("cpu"), paths=("fla_installed",))
    row = {"section": "grid", "op": "gated_delta_rule", "shape": [1, 3, 1, 2]}
    kg.measure_references(grid, "gated_delta_rule", {"q": torch.randn(2, 3, requires_grad=True)}, row)
    assert row["references"] == ["fla_installed"] and "fla_triton_fwd" not in row
    assert row["fla_fwd"] == 1.0 and row["fla_fb"] == 4.0


def test_errors_are_measured_against_every_path_and_gradients_against_the_first():
    x = {"q": torch.randn(4, 3, requires_grad=True)}
    row = {"fla_triton_fwd": 1.0, "fla_triton_fb": 1.0, "fla_installed_fwd": 1.0}
    paths = {"fla_triton": (lambda x: x["q"] * 2.0, refs.TRITON_PATH),
             "fla_installed": (lambda x: x["q"] * 2.2, {})}
    refs.add_errors(lambda x: x["q"] * 2.0, paths, x, row)
    assert row["rel_o_vs_fla_triton"] == 0.0
    assert row["rel_o_vs_fla_installed"] == pytest.approx(0.2 / 2.2, rel=1e-5)
    assert row["rel_grad_ref"] == "fla_triton" and row["rel_grad_vs_fla"] == {"q": 0.0}
