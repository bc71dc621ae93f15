import pandas as pd
import torch

from ltm.stages.benchmark import summarise, write_plot_tables

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


def test_one_plot_table_per_group_with_labelled_rows(tmp_path):
    table = pd.DataFrame([
        {"group": "mixer forward B=1 T=64", "case": "deltanet", "impl": "naive", "ms": 4.0, "speedup": 1.0},
        {"group": "mixer forward B=1 T=64", "case": "deltanet", "impl": "torch", "ms": 1.0, "speedup": 4.0},
        {"group": "delta_rule fwd", "case": "1,20,1,16", "impl": "torch_chunk", "ms": 2.0, "speedup": 1.5}])
    (tmp_path / "stale.csv").write_text("from an earlier run\n")
    write_plot_tables(table, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["delta-rule-fwd.csv", "mixer-forward-b-1-t-64.csv"]
    mixer = pd.read_csv(tmp_path / "mixer-forward-b-1-t-64.csv")
    assert mixer.label.tolist() == ["deltanet naive", "deltanet torch"] and mixer.speedup.tolist() == [1.0, 4.0]
