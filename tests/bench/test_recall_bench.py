"""ltm.bench.recall: a tiny run end to end gives the table by mixer and distance bin; the accuracy
is the share a model gets right, checked on an oracle whose answers are known; the models are
matched in size; a bad mixer entry is a one-line error."""
import dataclasses
import math
import os

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import ltm.bench.recall as recall_module
from ltm.bench.recall import (RecallBench, beyond_window, bench_recall, distance_bins, lr_factor,
                              margins_over_window, matched_configs, recall_accuracy, recall_metrics)
from ltm.data.recall import RecallTask, recall_batch
from ltm.model.lm import LTM
from ltm.params import ParamsError
from ltm.workers import run_jobs

TINY = RecallBench(mixers=["attention", "attention:window", "deltanet"], steps=3, batch=4,
                   seq_len=32, window=4, n_pairs=3, n_keys=8, n_values=8, eval_sequences=8,
                   d_model=16, n_layers=1, n_heads=2, seeds=2, workers=1)


def test_a_tiny_run_gives_every_mixer_and_bin(monkeypatch):
    started = []

    def recorded(fn, jobs, *rest):
        started.extend((job[2], job[3]) for job in jobs)
        return run_jobs(fn, jobs, *rest)

    monkeypatch.setattr(recall_module, "run_jobs", recorded)
    result = bench_recall(TINY, progress=False)
    assert started[:2] == [("deltanet", 0), ("deltanet", 1)]  # the longest runs start first
    table = result.table
    assert list(table.columns) == ["mixer", "params", "bin", "low", "high", "accuracy", "se", "n",
                                   "correct", "seeds"]
    assert list(table["mixer"].unique()) == TINY.mixers
    assert list(table["bin"].unique()) == ["1-4 (within window)", "5-8 (1-2x window)",
                                          "9-16 (2-4x window)", "17-32 (> 4x window)"]
    # every answer lands in one bin: 8 sequences x 3 answers per mixer and seed
    assert (table.groupby("mixer")["n"].sum() == 2 * 8 * 3).all() and (table["seeds"] == 2).all()
    assert (result.runs.groupby(["mixer", "seed"])["n"].sum() == 8 * 3).all()
    assert table["accuracy"].between(0, 1).all()
    assert list(result.curve.columns) == ["mixer", "seed", "step", "loss"]
    assert len(result.curve) == 2 * 3 * 3
    # deltanet ran first (the longest on a CPU), yet rows and curves come seed-major, mixers in
    # their listed order
    seed_major = [(s, m) for s in (0, 1) for m in TINY.mixers]
    assert list(result.runs[["seed", "mixer"]].drop_duplicates().itertuples(index=False,
                                                                          name=None)) == seed_major
    assert list(result.curve[["seed", "mixer"]].drop_duplicates().itertuples(index=False,
                                                                           name=None)) == seed_major
    metrics = recall_metrics(result, TINY, "cpu")
    assert set(metrics["by_mixer"]) == set(TINY.mixers)
    assert metrics["best_beyond_window"]["mixer"] in TINY.mixers
    assert all(len(m["beyond_window"]["per_seed"]) == 2 for m in metrics["by_mixer"].values())
    assert metrics["margins_over_sliding_window"] == {}  # no other `:window` model


def test_the_seeds_train_different_models_on_different_batches():
    one = dataclasses.replace(TINY, mixers=["attention"], seeds=1)
    first, second = (bench_recall(dataclasses.replace(one, seed=s), progress=False) for s in (0, 1))
    both = bench_recall(dataclasses.replace(one, seeds=2), progress=False)
    # seed 1 of a two-seed run is the one-seed run from seed 1: its model, batches and curve
    assert both.curve[both.curve.seed == 1]["loss"].tolist() == second.curve["loss"].tolist()
    assert both.curve[both.curve.seed == 0]["loss"].tolist() == first.curve["loss"].tolist()
    assert first.curve["loss"].tolist() != second.curve["loss"].tolist()


def test_runs_spread_over_worker_processes_give_the_same_answer():
    # one intra-op thread each way: the workers take cores // workers (1 on CI's two cores)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        alone = bench_recall(TINY, progress=False)
    finally:
        torch.set_num_threads(threads)
    spread = bench_recall(dataclasses.replace(TINY, workers=2), progress=False)
    if (os.cpu_count() or 1) // 2 == 1:
        pd.testing.assert_frame_equal(spread.table, alone.table)
        pd.testing.assert_frame_equal(spread.curve, alone.curve)
    else:  # more threads per worker: the same runs up to rounding
        assert spread.table[["mixer", "bin", "n"]].equals(alone.table[["mixer", "bin", "n"]])
        assert np.allclose(spread.curve["loss"], alone.curve["loss"], rtol=1e-4)


def test_workers_must_not_be_negative():
    with pytest.raises(ParamsError, match="workers"):
        RecallBench(workers=-1)


def runs_of(accuracy: dict[str, list[float]], n: int = 100, window: int = 4) -> pd.DataFrame:
    """Per-seed runs with one bin beyond the window whose accuracies are given per mixer."""
    return pd.DataFrame([{"mixer": m, "seed": s, "params": 1, "bin": "far", "low": window,
                          "high": 2 * window, "n": n, "correct": round(a * n)}
                         for m, values in accuracy.items() for s, a in enumerate(values)])


def test_the_se_adds_the_seeds_spread_to_the_sampling():
    far = beyond_window(runs_of({"a": [0.2, 0.4, 0.3], "b": [0.3]}), 4).set_index("mixer")
    assert far.loc["a", "accuracy"] == pytest.approx(0.3) and far.loc["a", "n"] == 300
    spread = np.var([0.2, 0.4, 0.3], ddof=1) / 3
    assert far.loc["a", "se"] == pytest.approx(math.sqrt(spread + 0.3 * 0.7 / 100))
    assert far.loc["b", "se"] == pytest.approx(math.sqrt(0.3 * 0.7 / 100))  # one seed: binomial


def test_margins_pair_the_seeds():
    runs = runs_of({"attention:window": [0.1, 0.3], "titans:window": [0.2, 0.5],
                    "attention": [0.9, 0.9]})
    margins = margins_over_window(runs, 4)
    assert list(margins) == ["titans:window"]
    m = margins["titans:window"]
    assert m["per_seed"] == [0.1, 0.2] and m["difference"] == pytest.approx(0.15)
    sampling = 0.35 * 0.65 / 100 + 0.2 * 0.8 / 100
    assert m["se"] == pytest.approx(math.sqrt(np.var([0.1, 0.2], ddof=1) / 2 + sampling), abs=1e-4)
    assert margins_over_window(runs[runs.mixer != "attention:window"], 4) == {}


class Oracle(nn.Module):
    """Looks each key up where it was written, if that is at most `reach` tokens back: the
    one-hot logits of the value written there (else of token 0, a filler: always wrong)."""

    def __init__(self, task: RecallTask, reach: int):
        super().__init__()
        self.task, self.reach = task, reach

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(*tokens.shape, self.task.vocab_size)
        for b, seq in enumerate(tokens.tolist()):
            for t, token in enumerate(seq):
                first = seq.index(token)
                hit = token >= self.task.n_filler and first < t and t - first <= self.reach
                out[b, t, seq[first + 1] if hit else 0] = 1.0
        return out


def test_accuracy_is_the_share_of_answers_the_model_gets_right():
    task = RecallTask(seq_len=64, n_pairs=6, n_keys=8, n_values=8)
    batch = recall_batch(task, 40, seed=2)
    bins = distance_bins(8, 64)
    reach = 12  # inside the 1-2x bin (9-16): a part of it right, the bins below all, above none
    rows = recall_accuracy(Oracle(task, reach), batch, bins, chunk=7)
    dist = batch.distance[batch.mask]
    for row, (lo, hi, label) in zip(rows, bins):
        inside = (dist > lo) & (dist <= hi)
        expected = float((dist[inside] <= reach).float().mean())
        assert row["bin"] == label and row["n"] == int(inside.sum())
        assert row["accuracy"] == pytest.approx(expected)
        assert row["se"] == pytest.approx(math.sqrt(expected * (1 - expected) / row["n"]))
    assert rows[0]["accuracy"] == 1.0 and 0 < rows[1]["accuracy"] < 1 and rows[3]["accuracy"] == 0.0


def test_the_models_are_matched_in_size_to_one_mlp_column():
    bench = RecallBench(mixers=["attention", "rwkv7", "deltanet"], d_model=32, n_layers=2)
    sizes = {}
    for entry, cfg in matched_configs(bench).items():
        sizes[entry] = LTM(cfg).num_params(non_embedding=True)
    assert max(sizes.values()) - min(sizes.values()) <= 3 * 32 * 2


@pytest.mark.parametrize("mixers, message", [
    (["mamba"], "mixers: 'mamba': model.mixer"),
    (["attention:wide"], "mixers: 'attention:wide': unknown option 'wide'"),
    (["rwkv7:window"], "mixers: 'rwkv7:window': model.window"),
    ([], "mixers: must name one or more models"),
    (["rwkv7", "rwkv7"], "mixers: each entry once"),
])
def test_a_bad_mixer_entry_is_a_one_line_error(mixers, message):
    with pytest.raises(ParamsError, match=message) as err:
        RecallBench(mixers=mixers)
    assert "\n" not in str(err.value)


def test_the_learning_rate_warms_up_then_decays_to_a_tenth():
    factors = [lr_factor(s, 100) for s in range(100)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert factors[-1] == pytest.approx(0.1, abs=1e-3)
    assert all(a >= b for a, b in zip(factors[9:], factors[10:]))


def test_titans_is_one_more_entry_with_its_window_the_benchmarks():
    bench = RecallBench(mixers=["attention:window", "titans:window", "titans"], window=8, seq_len=32,
                        n_pairs=2, d_model=16, n_heads=2)
    configs = matched_configs(bench)
    assert configs["titans:window"].mixer == "titans" and configs["titans:window"].titans_window == 8
    assert configs["titans"].titans_window != 8 and configs["attention:window"].window == 8
