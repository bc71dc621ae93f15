import pandas as pd
import torch

from ltm.bench.stage import summarise

RECORD = {"device": "Some GPU", "commit": "abc1234", "rows": [
    {"op": "delta_rule", "impl": "triton", "B": 2, "T": 63, "H": 3, "D": 32, "pass": "fwd+bwd",
     "ms": 2.0, "x_fla": 1.25},
    {"op": "delta_rule", "impl": "fla", "B": 2, "T": 63, "H": 3, "D": 32, "pass": "fwd+bwd",
     "ms": 2.5, "x_fla": 1.0}]}


def test_the_metrics_hold_this_runs_measurements_only():
    """GPU records of earlier commits are the report's history, never this commit's metrics."""
    table = pd.DataFrame([
        {"group": "mixer forward B=1 T=64", "case": "deltanet", "impl": "torch", "pass": "forward",
         "ms": 1.0, "speedup": 4.0},
        {"group": "generate 8 tokens", "case": "deltanet", "impl": "cached", "pass": "generate",
         "ms": 2.0, "speedup": 3.0}])
    summary = summarise(table, torch.device("cpu"))
    assert summary["chunk_vs_naive_forward"] == {"deltanet": 4.0}
    assert summary["cached_vs_uncached_generate"] == {"deltanet": 3.0}
    assert set(summary) == {"device", "torch", "chunk_vs_naive_forward", "cached_vs_uncached_generate"}
