"""The report's recall section (the benchmark stage's recall.json and recall.csv): the summary line,
the figure (ltm.report.recall_figure) and the table by mixer and distance bin."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ltm.report.gpu import Section
from ltm.report.recall_figure import recall_figure, recall_summary

NOTE = ("Multi-query associative recall (ltm/data/recall.py): {n_pairs} key-value pairs written "
        "through each {seq_len}-token sequence and each key queried once later; a model is scored "
        "on the value it predicts at each query. Every mixer is trained here for {steps} steps on "
        "the same batches from the same seed, once per training seed ({seeds}), its size matched "
        "to the others through the MLP's width (the table gives each count); accuracy on "
        "{eval_sequences} held-out sequences by the distance from the write to the query, "
        "averaged over the seeds, ± one standard error (the seeds' spread and the evaluation's "
        "sampling); chance "
        "{chance:.3f}. Sliding-window attention sees {window} tokens per layer, so at most "
        "{n_layers} x ({window} - 1) back through its {n_layers} layers: beyond that it can only "
        "guess. {seconds:.0f} s on {device}.")


def recall_section(results_dir: Path, plots_dir: Path, commit: str | None = None) -> Section:
    """The report's recall section: the summary line, the figure and the table by mixer and bin."""
    title = "Recall against distance"
    path, plot = Path(results_dir) / "recall.json", Path(plots_dir) / "recall.csv"
    metrics = json.loads(path.read_text()) if path.is_file() else None
    if not metrics or not metrics.get("enabled") or not plot.is_file():
        why = "recall.enabled is false" if metrics else "the recall stage wrote no recall.json"
        return Section(title, [], [], f"No recall results: {why}.")
    table = pd.read_csv(plot)
    shown = table[["mixer", "params", "bin", "accuracy", "se", "n"]].round({"accuracy": 3, "se": 3})
    # the settings repeat some top-level keys (enabled): one mapping, the settings winning (a
    # record from before `seeds` trained one)
    note = recall_summary(metrics) + " " + NOTE.format(**{**metrics, "seeds": 1, **metrics["settings"]})
    return Section(title, [shown], [recall_figure(table, metrics, commit=commit)], note)
