"""The kernel benchmark: its floor formulas, its config checks, and a tiny CPU run."""
import pytest
import torch

from ltm.bench import kernels as bench
from ltm.bench.kernels import (KernelBenchConfig, _add_fla_ratios, floor_counts, floor_ms, format_table,
                               implementations, make_inputs, run)
from ltm.params import ParamsError, from_mapping
from ltm.report.figures import kernel_grid_figure


def test_floor_counts_match_hand_counts():
    # delta rule forward at 8,2048,8,128 in bf16: q, k, v read and o written once (+ beta)
    n = 8 * 2048 * 8 * 128
    nbytes, flops = floor_counts("delta_rule", 8, 2048, 8, 128, 2, backward=False)
    assert nbytes == 4 * n * 2 + 8 * 2048 * 8 * 2
    assert flops == 2.0 * 8 * 2048 * 8 * (5 * 64 * 128 + 3 * 128 * 128)
    nbytes_b, flops_b = floor_counts("delta_rule", 8, 2048, 8, 128, 2, backward=True)
    assert nbytes_b == nbytes + 7 * n * 2 + 2 * 8 * 2048 * 8 * 2 and flops_b == 3 * flops
    assert floor_counts("sdpa", 1, 4, 1, 2, 4, backward=False) == (4 * 8 * 4, 2.0 * 4 * 4 * 2)
    assert floor_counts("rwkv7", 1, 3, 1, 4, 2, backward=False) == (7 * 12 * 2, 9.0 * 3 * 16)


def test_config_rejects_bad_values_with_one_line():
    with pytest.raises(ParamsError, match="bench_kernels.shapes"):
        from_mapping(KernelBenchConfig, {"shapes": [[1, 2, 3]]}, "bench_kernels")
    with pytest.raises(ParamsError, match="bench_kernels.ops"):
        from_mapping(KernelBenchConfig, {"ops": ["mamba"]}, "bench_kernels")
    with pytest.raises(ParamsError, match="bench_kernels.dtype"):
        from_mapping(KernelBenchConfig, {"dtype": "int8"}, "bench_kernels")


def test_tiny_cpu_run_times_every_available_implementation():
    cfg = KernelBenchConfig(shapes=[[1, 16, 1, 16]], naive_tokens=8, warmup_ms=1, rep_ms=1)
    rows = run(cfg, device="cpu")
    impls = {(r["op"], r["impl"], r["pass"]) for r in rows}
    for op in ("delta_rule", "gated_delta_rule", "rwkv7"):
        assert (op, "naive@short", "fwd") in impls and (op, "naive@short", "fwd+bwd") in impls
    assert ("delta_rule", "sdpa", "fwd+bwd") in impls
    for r in rows:
        assert r["ms"] > 0 and r["floor_ms"] > 0 and r["x_floor"] == pytest.approx(r["ms"] / r["floor_ms"])
        assert r["x_fla"] is None and r["copy_bytes_per_s"] > 0 and r["matmul_flops_per_s"] > 0
    assert len(format_table(rows).splitlines()) == len(rows) + 1


def test_impls_picks_the_implementations_to_time():
    cfg = KernelBenchConfig(shapes=[[1, 16, 1, 16]], ops=["delta_rule"], impls=["torch_chunk"],
                            naive_tokens=8, warmup_ms=1, rep_ms=1)
    rows = run(cfg, device="cpu")
    assert {r["impl"] for r in rows} == {"torch_chunk"} and len(rows) == 2
    with pytest.raises(ParamsError, match="bench_kernels.impls"):
        from_mapping(KernelBenchConfig, {"impls": ["cuda"]}, "bench_kernels")


def test_an_implementation_that_refuses_its_inputs_gets_rows_with_the_reason(monkeypatch):

    def refuse(x):
        raise ValueError("float32 is not supported")

    def with_refusal(op, device):
        return {**implementations(op, device), "fla": refuse}

    implementations = bench.implementations
    monkeypatch.setattr(bench, "implementations", with_refusal)
    cfg = KernelBenchConfig(shapes=[[1, 8, 1, 16]], ops=["rwkv7"], naive_tokens=4, warmup_ms=1, rep_ms=1)
    rows = bench.run(cfg, device="cpu")
    refused = [r for r in rows if r["impl"] == "fla"]
    assert [r["pass"] for r in refused] == ["fwd", "fwd+bwd"]
    assert all(r["ms"] is None and r["error"] == "float32 is not supported" for r in refused)
    assert "failed: float32 is not supported" in format_table(rows)
    assert all(r["x_fla"] is None for r in rows)


def test_fla_ratio_is_fla_time_over_ours_for_the_same_case():
    case = dict(op="delta_rule", B=1, T=64, H=2, D=32)
    rows = [dict(case, impl="triton", ms=2.0, **{"pass": "fwd"}),
            dict(case, impl="fla", ms=1.0, **{"pass": "fwd"}),
            dict(case, impl="triton", ms=4.0, **{"pass": "fwd+bwd"})]
    _add_fla_ratios(rows)
    assert [r["x_fla"] for r in rows] == [0.5, 1.0, None]


def test_kernel_grid_figure_draws_one_panel_per_op_and_pass():
    import pandas as pd

    grid = pd.DataFrame([
        {"op": "delta_rule", "B": 1, "T": 512, "H": 4, "D": 64, "pass": "fwd", "ours_x_floor": 4.0, "fla_x_floor": 6.0},
        {"op": "delta_rule", "B": 2, "T": 512, "H": 4, "D": 64, "pass": "fwd", "ours_x_floor": 3.0, "fla_x_floor": None},
        {"op": "delta_rule", "B": 1, "T": 512, "H": 4, "D": 64, "pass": "fwd+bwd", "ours_x_floor": 9.0, "fla_x_floor": 7.0}])
    fig = kernel_grid_figure(grid)
    assert len(fig.axes) == 2 and [ax.get_title() for ax in fig.axes] == ["delta_rule fwd", "delta_rule fwd+bwd"]
    # GPU times, where the record has them, as rings beside ours
    fig = kernel_grid_figure(grid.assign(ours_x_floor_graph=[3.5, None, 8.0]))
    rings = [line for line in fig.axes[0].get_lines() if line.get_label() == "ours, GPU time"]
    assert len(rings) == 1 and list(rings[0].get_xdata()) == [3.5]


def test_floor_ms_is_the_slower_of_moving_the_bytes_and_doing_the_flops():
    nbytes, flops = floor_counts("delta_rule", 8, 2048, 8, 128, 2, backward=True)
    memory_bound = {"copy_bytes_per_s": nbytes / 2e-3, "matmul_flops_per_s": flops / 1e-3}
    compute_bound = {"copy_bytes_per_s": nbytes / 1e-3, "matmul_flops_per_s": flops / 3e-3}
    assert floor_ms("delta_rule", 8, 2048, 8, 128, 2, True, memory_bound) == pytest.approx(2.0)
    assert floor_ms("delta_rule", 8, 2048, 8, 128, 2, True, compute_bound) == pytest.approx(3.0)


def test_the_titans_rows_time_the_same_function_by_both_forms():
    """The memory's kernel rows: its token loop and chunked form on the bench's own inputs
    compute the same outputs, and a run times both at the short length."""

    x = make_inputs("titans", 1, 37, 2, 8, torch.float64, "cpu")
    impls = implementations("titans", torch.device("cpu"))
    assert set(impls) == {"naive", "torch_chunk"}
    torch.testing.assert_close(impls["torch_chunk"](x), impls["naive"](x), rtol=1e-9, atol=1e-9)
    rows = run(KernelBenchConfig(shapes=[[1, 20, 1, 8]], naive_tokens=8, ops=["titans"],
                                 warmup_ms=1, rep_ms=1), torch.device("cpu"))
    assert {(r["impl"], r["T"]) for r in rows} >= {("torch_chunk", 20), ("naive@short", 8),
                                                  ("torch_chunk@short", 8)}
