"""Smoke test of the model benchmarks on tiny sizes: the rows are complete and consistent (no
timing is asserted)."""
from __future__ import annotations

import math

from ltm.bench.model import VARIANTS, bench_generate, bench_mixers
from ltm.model import ModelConfig

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
    rows = bench_generate(TINY, batch=1, prompt_len=3, new_tokens=5, warmup=0, repeats=1,
                          variants={k: VARIANTS[k] for k in ("attention", "deltanet-hier")})
    assert [(r["mixer"], r["impl"]) for r in rows] == [
        ("attention", "uncached"), ("attention", "cached"),
        ("deltanet-hier", "uncached"), ("deltanet-hier", "cached")]
    for row in rows:
        assert row["same"] is True and row["new_tokens"] == 5 and row["ms"] > 0
    assert rows[0]["speedup"] == 1.0 and math.isclose(rows[1]["speedup"], rows[0]["ms"] / rows[1]["ms"])
