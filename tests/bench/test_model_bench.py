"""Smoke test of the model and generation benchmarks on tiny sizes: the rows are complete and
consistent (no timing is asserted)."""
from __future__ import annotations

import dataclasses
import importlib.util
import math

import pytest
import torch

from ltm.bench.model import (VARIANTS, bench_generate, bench_generate_memory, bench_mixers,
                             bench_quantization)
from ltm.model.lm import ModelConfig

TINY = ModelConfig(vocab_size=29, n_layers=1, d_model=16, n_heads=2, max_seq_len=16, chunk_size=4)


def test_bench_mixers_rows():
    rows = bench_mixers(TINY, batch=2, seq_len=9, warmup=0, repeats=1)
    # attention has one implementation, the linear mixers two; each timed forward and backward
    assert len(rows) == 2 * (1 + 2 * (len(VARIANTS) - 1))
    for row in rows:
        assert row.keys() == {"mixer", "impl", "pass", "B", "T", "ms", "tokens_per_s", "speedup",
                              "error"}
        assert row["error"] is None
        assert row["ms"] > 0 and math.isclose(row["tokens_per_s"], 18 / (row["ms"] / 1e3))
    naive = [r for r in rows if r["impl"] == "naive"]
    assert naive and all(r["speedup"] == 1.0 for r in naive)
    assert {r["mixer"] for r in rows} == set(VARIANTS)


def test_bench_generate_rows():
    rows = bench_generate(TINY, batch=2, prompt_len=3, new_tokens=5, warmup=0, repeats=1,
                          variants={k: VARIANTS[k] for k in ("attention", "deltanet-hier")})
    assert [(r["mixer"], r["impl"]) for r in rows] == [
        (name, impl) for name in ("attention", "deltanet-hier")
        for impl in ("uncached", "cached", "static")]
    for row in rows:
        assert row["same"] is True and row["error"] is None and row["new_tokens"] == 5
        assert row["ms"] > 0 and math.isclose(row["tokens_per_s"], 10 / (row["ms"] / 1e3))
        if row["impl"] == "uncached":
            assert math.isnan(row["prefill_ms"])
        else:
            # no comparison of the two times: both are measured, and a loaded machine can
            # stretch either (a timed assertion failed under load)
            assert row["prefill_ms"] > 0
            assert math.isclose(row["ms_per_token"], (row["ms"] - row["prefill_ms"]) / 4)
    assert rows[0]["speedup"] == 1.0
    assert math.isclose(rows[1]["speedup"], rows[0]["ms"] / rows[1]["ms"])


def test_a_path_that_cannot_run_is_an_error_row():
    rows = bench_generate(TINY, batch=1, prompt_len=2, new_tokens=3, warmup=0, repeats=1,
                          variants={"rwkv7": VARIANTS["rwkv7"]}, impls=("cached", "int4"))
    assert rows[0]["error"] is None and rows[0]["same"] is True
    assert rows[1]["error"].startswith("GenerationError: quantize int4: ")
    assert math.isnan(rows[1]["ms"]) and rows[1]["same"] is None


def test_generation_state_grows_with_context_for_attention_only():
    rows = bench_generate_memory(TINY, contexts=(8, 16), steps=1,
                                 variants={k: VARIANTS[k] for k in ("attention", "deltanet")})
    mib = {(r["mixer"], r["context"]): r["cache_mib"] for r in rows}
    assert mib["deltanet", 16] == mib["deltanet", 8]
    # keys and values of 1 layer, 16 dims, 4 bytes, per position
    assert math.isclose((mib["attention", 16] - mib["attention", 8]) * 2**20, 8 * 2 * 16 * 4)
    assert all(r["ms_per_token"] > 0 for r in rows)


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed")
def test_bench_quantization_rows():
    batches = [(torch.randint(0, 29, (2, 8)), torch.randint(0, 29, (2, 8)))]
    rows = bench_quantization(dataclasses.replace(TINY, d_model=32), ("int8", "int4"), batches,
                              variants={"deltanet": VARIANTS["deltanet"]})
    int8, int4 = rows
    assert int8["error"] is None and abs(int8["loss_delta"]) < 0.05 * int8["loss"]
    assert "CUDA GPUs only" in int4["error"]
