"""ltm.study.verdict: paired differences with their standard errors, and the sentences."""
import math

import numpy as np
import pytest

from ltm.study.verdict import (mean_se, mean_se_over_seeds, paired, paired_over_seeds, sentence,
                               verdict)


def test_a_paired_difference_is_the_mean_and_standard_error_of_the_differences():
    control, model = np.array([3.0, 2.5, 4.0, 3.5]), np.array([2.0, 2.0, 3.0, 3.5])
    diff = control - model
    got = paired(control, model)
    assert got["mean"] == pytest.approx(diff.mean())
    assert got["se"] == pytest.approx(diff.std(ddof=1) / 2)
    assert got["z"] == pytest.approx(diff.mean() / got["se"]) and got["sequences"] == 4
    # pairing removes what both share: a common per-sequence offset changes nothing
    offset = np.array([10.0, -3.0, 7.0, 0.5])
    assert paired(control + offset, model + offset)["se"] == pytest.approx(got["se"])
    assert mean_se(control + offset)["se"] > got["se"]


def test_sentences_say_who_wins_only_beyond_five_standard_errors():
    win = {"mean": 0.2, "se": 0.01, "z": 20.0}
    loss = {"mean": -0.2, "se": 0.01, "z": -20.0}
    tie = {"mean": 0.02, "se": 0.01, "z": 2.0}
    assert sentence("plain", win).startswith("latent beats plain by 0.200 +- 0.010")
    assert sentence("plain", loss).startswith("latent loses to plain by 0.200")
    assert "no difference beyond 5 SE" in sentence("plain", tie)
    assert "no difference" in sentence("plain", {"mean": 0.0, "se": 0.0, "z": math.nan})
    lines = verdict("testbed", {"b": win, "a": tie}, {"a": "A", "b": "B", "c": "C"})
    assert lines[0].startswith("testbed: latent vs A") and lines[1].startswith("testbed: latent beats B")
    assert len(lines) == 2


def test_over_seeds_the_error_adds_the_seeds_spread_to_the_sequences():
    rng = np.random.default_rng(0)
    model = rng.normal(3.0, 0.5, size=(3, 40))
    # every seed's control worse by 0.1 on every sequence, plus a seed-wide shift
    control = model + 0.1 + np.array([[0.0], [0.3], [-0.3]])
    got = paired_over_seeds(control, model)
    assert got["mean"] == pytest.approx(0.1) and got["seeds"] == 3 and got["sequences"] == 40
    assert got["per_seed"] == pytest.approx([0.1, 0.4, -0.2])
    assert got["seed_sd"] == pytest.approx(0.3)
    # the sequences agree exactly (no sampling term): the SE is the seeds' alone, sd / sqrt(3)
    assert got["se"] == pytest.approx(0.3 / math.sqrt(3))
    # one seed: exactly the paired comparison over sequences
    noisy = control[:1] + rng.normal(0, 0.1, (1, 40))
    one = paired_over_seeds(noisy, model[:1])
    assert one["seed_sd"] is None and one["seeds"] == 1
    assert one["se"] == pytest.approx(paired(noisy[0], model[0])["se"]) and one["se"] > 0
    assert mean_se_over_seeds(model[:1])["se"] == pytest.approx(mean_se(model[0])["se"])
    assert "3 seeds" in sentence("plain", {**got, "z": 20.0})
