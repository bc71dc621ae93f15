"""ltm.study.run: the study end to end on a tiny testbed, and what it writes."""
import json

import pytest

from ltm.data.cache import DataConfig
from ltm.data.synthetic import SyntheticConfig
from ltm.study.run import CONTROLS, encoder_buys, run_study
from ltm.study.settings import StudyConfig

SYN = SyntheticConfig(topics=2, symbols=6, length=16, train_sequences=64, val_sequences=12)
CFG = StudyConfig(sources=["testbed"], d_model=16, n_heads=2, n_latent=2, steps=8, batch_size=4,
                  warmup_steps=2, val_sequences=12, inner_steps=1, encoder_curve=[0, 2],
                  cold_curve=[0, 2], curve_sequences=4, dynamic_lrs=[0.01, 0.1], seeds=2)


def test_the_study_scores_every_control_paired_and_writes_its_verdict(tmp_path):
    data = DataConfig(source="synthetic", synthetic=SYN, cache_dir="unused")
    path = tmp_path / "study.json"
    metrics = run_study(CFG, data, 0, path, progress=False, say=lambda *a: None)
    assert json.loads(path.read_text())["verdict"] == metrics["verdict"]
    s = metrics["sources"]["testbed"]
    assert set(s["gain_over"]) == set(CONTROLS) and s["sequences"] == 12
    assert all(g["sequences"] == 12 and g["seeds"] == 2 and len(g["per_seed"]) == 2
               for g in s["gain_over"].values()) and s["seeds"] == 2
    # the gain is the mean of the seeds' own gains, its SE at least their spread's share
    plain = s["gain_over"]["plain"]
    assert plain["mean"] == pytest.approx(sum(plain["per_seed"]) / 2)
    assert plain["se"] >= plain["seed_sd"] / 2 ** 0.5
    assert {"exact", "window_floor"} <= set(s["suffix_nll"]) and set(s["gap_to_exact"]) >= {"latent"}
    # the curve: the encoder's steps (the trained count among them) and both cold starts
    inits = {(r["init"], r["steps"]) for r in s["curves"]}
    assert inits == {("encoder", 0), ("encoder", 1), ("encoder", 2), ("authors", 0),
                     ("authors", 2), ("prior", 0), ("prior", 2)}
    assert [d["lr"] in CFG.dynamic_lrs for d in s["dynamic_evaluation"]] == [True, True]
    assert len(metrics["verdict"]) == len(CONTROLS)


def test_an_off_study_writes_that_it_is_off(tmp_path):
    off = StudyConfig(enabled=False)
    metrics = run_study(off, DataConfig(cache_dir="unused"), 0, tmp_path / "s.json")
    assert metrics == {"enabled": False}


def test_the_encoder_is_matched_by_the_fewest_cold_steps_that_reach_its_bound():
    rows = [{"init": "encoder", "steps": 2, "bound": 3.0, "ms_per_sequence": 1.0}]
    rows += [{"init": "authors", "steps": n, "bound": b, "ms_per_sequence": n}
             for n, b in [(0, 9.0), (16, 3.1), (64, 2.9)]]
    rows += [{"init": "prior", "steps": n, "bound": b, "ms_per_sequence": n}
             for n, b in [(0, 4.0), (64, 3.2)]]
    got = encoder_buys(rows, 2)
    assert got["authors"] == {"steps_to_match": 64, "ms_per_sequence": 64}
    assert got["prior"] == {"steps_to_match": None, "best_bound": pytest.approx(3.2)}
