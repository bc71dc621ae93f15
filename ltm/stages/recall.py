"""The recall stage: multi-query associative recall against distance, per token mixer
(params.yaml `recall`, ltm.bench.recall): small models trained here over several seeds, on no
checkpoint of the train stage, so that an experiment on the trained model never retrains them.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ltm.bench.recall import RecallBench, bench_recall, recall_metrics
from ltm.device import device_name, resolve_device
from ltm.params import load_section


# the columns of the recall plot table (written with its header alone when recall.enabled is false)
RECALL_COLUMNS = ["mixer", "params", "bin", "low", "high", "accuracy", "se", "n", "correct", "seeds"]


def recall_benchmark(params_path: str | Path, metrics_path: str | Path, plot_path: str | Path,
                     progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """The recall stage (params.yaml `recall`, ltm.bench.recall): its metrics (recall.json) and
    one row per mixer and distance bin (plot_path). Returns (table, loss curve, metrics); the
    notebook shows no progress bar (a stored notebook keeps every update). Paths from dvc.yaml."""
    cfg = load_section(RecallBench, "recall", params_path)
    device = resolve_device(cfg.device, "recall.device")
    name = device_name(device)
    if cfg.enabled:
        result = bench_recall(cfg, device, progress)
        table, curve = result.table, result.curve
        metrics = {"enabled": True, **recall_metrics(result, cfg, name)}
    else:
        table, curve = pd.DataFrame(columns=RECALL_COLUMNS), pd.DataFrame(columns=["mixer", "step", "loss"])
        metrics = {"enabled": False}
    for path in (metrics_path, plot_path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(metrics_path).write_text(json.dumps(metrics, indent=1) + "\n")
    table.to_csv(plot_path, index=False)
    return table, curve, metrics
