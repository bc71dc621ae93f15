"""ltm.stages.recall: the recall stage writes its metrics and plot table, or an empty table with
its columns when switched off; a bad device is one line."""
import pandas as pd
import pytest

from ltm.params import ParamsError
from ltm.stages.recall import RECALL_COLUMNS, recall_benchmark


def _recall_params(tmp_path, **recall):
    import yaml
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"recall": {"device": "cpu", **recall}}))
    return path


def test_the_recall_benchmark_writes_its_metrics_and_table(tmp_path):
    import json
    params = _recall_params(tmp_path, mixers=["attention:window"], steps=2, batch=2, seq_len=16,
                            window=2, n_pairs=2, n_keys=4, n_values=4, eval_sequences=4,
                            d_model=8, n_layers=1, n_heads=2, seeds=2)
    table, curve, metrics = recall_benchmark(params, tmp_path / "m" / "recall.json",
                                             tmp_path / "p" / "recall.csv")
    assert list(table.columns) == RECALL_COLUMNS and len(curve) == 2 * 2
    assert json.loads((tmp_path / "m" / "recall.json").read_text()) == metrics
    assert metrics["enabled"] and metrics["best_beyond_window"]["mixer"] == "attention:window"
    assert pd.read_csv(tmp_path / "p" / "recall.csv")["n"].sum() == 2 * 4 * 2  # seeds x answers


def test_the_recall_benchmark_switched_off_writes_an_empty_table(tmp_path):
    params = _recall_params(tmp_path, enabled=False)
    table, _, metrics = recall_benchmark(params, tmp_path / "recall.json", tmp_path / "recall.csv")
    assert metrics == {"enabled": False} and table.empty
    assert list(pd.read_csv(tmp_path / "recall.csv").columns) == RECALL_COLUMNS


def test_an_unknown_device_is_one_line(tmp_path):
    with pytest.raises(ParamsError, match="recall.device"):
        recall_benchmark(_recall_params(tmp_path, device="tpu"), tmp_path / "r.json", tmp_path / "r.csv")
