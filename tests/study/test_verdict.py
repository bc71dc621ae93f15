"""ltm.study.verdict: paired differences with their standard errors, and the sentences."""
import math

import numpy as np
import pytest

from ltm.study.verdict import mean_se, paired, sentence, verdict


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
