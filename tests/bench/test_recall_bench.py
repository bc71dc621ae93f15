"""ltm.bench.recall: a tiny run end to end gives the table by mixer and distance bin; the accuracy
is the share a model gets right, checked on an oracle whose answers are known; the models are
matched in size; a bad mixer entry is a one-line error."""
import math

import pandas as pd
import pytest
import torch
from torch import nn

from ltm.bench.recall import (RecallBench, beyond_window, bench_recall, distance_bins, lr_factor,
                              matched_configs, recall_accuracy, recall_metrics)
from ltm.data.recall import RecallTask, recall_batch
from ltm.model.lm import LTM
from ltm.params import ParamsError

TINY = RecallBench(mixers=["attention", "attention:window", "deltanet"], steps=3, batch=4,
                   seq_len=32, window=4, n_pairs=3, n_keys=8, n_values=8, eval_sequences=8,
                   d_model=16, n_layers=1, n_heads=2)


def test_a_tiny_run_gives_every_mixer_and_bin():
    result = bench_recall(TINY, progress=False)
    table = result.table
    assert list(table.columns) == ["mixer", "params", "bin", "low", "high", "accuracy", "se", "n",
                                   "correct"]
    assert list(table["mixer"].unique()) == TINY.mixers
    assert list(table["bin"].unique()) == ["1-4 (within window)", "5-8 (1-2x window)",
                                          "9-16 (2-4x window)", "17-32 (> 4x window)"]
    # every answer lands in one bin: 8 sequences x 3 answers per mixer
    assert (table.groupby("mixer")["n"].sum() == 8 * 3).all()
    assert table["accuracy"].between(0, 1).all()
    assert list(result.curve.columns) == ["mixer", "step", "loss"] and len(result.curve) == 3 * 3
    metrics = recall_metrics(result, TINY, "cpu")
    assert set(metrics["by_mixer"]) == set(TINY.mixers)
    assert metrics["best_beyond_window"]["mixer"] in TINY.mixers


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


def test_beyond_the_window_pools_the_far_bins():
    table = pd.DataFrame({"mixer": ["a"] * 3 + ["b"] * 3, "low": [0, 4, 8] * 2,
                          "correct": [9, 3, 1, 5, 5, 5], "n": [10, 10, 10] * 2})
    far = beyond_window(table, 4).set_index("mixer")
    assert far.loc["a", "accuracy"] == pytest.approx(0.2) and far.loc["a", "n"] == 20
    assert far.loc["b", "se"] == pytest.approx(math.sqrt(0.5 * 0.5 / 20))


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
