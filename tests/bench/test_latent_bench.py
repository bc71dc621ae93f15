"""The inner-loop benchmark on a tiny model: rows complete and consistent, no timing asserted."""
from __future__ import annotations

import math

import pytest
import torch

from ltm.bench.latent import LatentBench, bench_latent, time_steps
from ltm.stages.benchmark import summarise
from ltm.model.lm import ModelConfig
from ltm.params import ParamsError, from_mapping

TINY = ModelConfig(vocab_size=29, n_layers=1, d_model=16, n_heads=2, max_seq_len=16)


def test_rows_are_multiples_of_the_same_implementations_plain_step():
    rows = bench_latent(TINY, LatentBench(n_latent=2, inner_steps=3, batch=2, seq_len=8,
                                          repeats=1), device="cpu", warmup=0)
    assert [(r["case"], r["impl"]) for r in rows] == [
        ("plain step", "eager"), ("inner step", "eager"), ("latent step (3 inner)", "eager")]
    plain, inner, latent = rows
    for row in rows:
        assert row["error"] is None and row["ms"] > 0 and row["group"] == "latent training B=2 T=8"
        assert math.isclose(row["x_plain"], row["ms"] / plain["ms"])
        assert math.isclose(row["speedup"], plain["ms"] / row["ms"])
        assert (row["n_latent"], row["inner_steps"], row["B"], row["T"]) == (2, 3, 2, 8)
    assert plain["x_plain"] == 1.0 and plain["speedup"] == 1.0
    assert math.isclose(latent["tokens_per_s"], 16 / (latent["ms"] / 1e3))
    assert math.isnan(inner["tokens_per_s"])  # an inner step trains no token
    summary = summarise(_with_other_groups(rows), torch.device("cpu"))
    assert set(summary["latent_x_plain_step"]) == {"inner step eager",
                                                   "latent step (3 inner) eager"}


def _with_other_groups(rows):
    import pandas as pd
    other = {"group": "mixer forward B=1 T=8", "case": "attention", "impl": "torch",
             "pass": "forward", "ms": 1.0, "speedup": 1.0}
    return pd.DataFrame([other, *rows])


def test_a_failing_implementation_is_a_row_that_says_why(monkeypatch):
    import ltm.bench.latent as module

    def broken(*args, **kwargs):
        if args[5]:  # compile
            raise RuntimeError("no compiler here")
        return {"plain": 2.0, "inner": 1.0, "latent": 4.0}

    monkeypatch.setattr(module, "time_steps", broken)
    rows = bench_latent(TINY, LatentBench(compile=True), device="cpu")
    compiled = [r for r in rows if r["impl"] == "compiled"]
    assert len(compiled) == 3 and all(math.isnan(r["ms"]) for r in compiled)
    assert all(r["error"] == "RuntimeError: no compiler here" for r in compiled)
    eager = [r for r in rows if r["impl"] == "eager"]
    assert [r["x_plain"] for r in eager] == [1.0, 0.5, 2.0]


def test_time_steps_times_the_three_steps():
    times = time_steps(TINY, batch=2, seq_len=8, n_latent=1, inner_steps=1, compile=False,
                       warmup=0, repeats=1)
    assert set(times) == {"plain", "inner", "latent"} and all(v > 0 for v in times.values())


def test_compile_auto_is_off_on_the_cpu_and_sizes_are_checked():
    rows = bench_latent(TINY, LatentBench(n_latent=1, inner_steps=1, batch=1, seq_len=4,
                                          repeats=1), device="cpu", warmup=0)
    assert {r["impl"] for r in rows} == {"eager"}
    with pytest.raises(ParamsError, match="inner_steps: must be >= 1, got 0"):
        from_mapping(LatentBench, {"inner_steps": 0}, "benchmark.latent")
