"""ltm.ablation.protocol: the verdicts of the protocol on a tiny model with a fake clock (cumulative
and one-at-a-time modes, failures, the rounding probe, the time budget) and the loss panel of its figure."""
import math
import time

import pandas as pd
import pytest
import torch

from ltm.ablation.protocol import ablate
from ltm.ablation.switches import AblateConfig
from ltm.report.figures import ablate_figure
from tiny_corpus import QUICK, TINY, cache_and_checkpoint



@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A token cache and the train stage's checkpoint of the tiny model."""
    return cache_and_checkpoint(tmp_path_factory.mktemp("ablate"), TINY)


def fake_timer(runner, step):
    """Steps with the fused loss take half the time; nothing else changes the clock."""
    step()
    return 0.5 if runner.trainer.sw.fused_loss else 1.0


def run(tiny, switches, **changes):
    cfg = AblateConfig(**{**QUICK, "switches": switches, **changes})
    return ablate(cfg, TINY, str(tiny / "cache"), tiny / "checkpoints", timer=fake_timer)


def test_broken_approximate_switch_fails_and_a_no_op_has_no_effect(tiny):
    # norm_eps = 1000 all but removes the trained scale of every RMSNorm: a broken variant
    result = run(tiny, ["model.norm_eps=1000", "train.opt.workers=0"],
                 registry={"model.norm_eps": {"kind": "approximate", "tolerance": 0.05}})
    table = result.table.set_index("switch")
    assert "the train stage's checkpoint" in result.info["baseline"]
    assert table.loc["baseline", "verdict"] == "BASELINE"
    assert table.loc["model.norm_eps=1000", "verdict"] == "FAIL"
    assert table.loc["model.norm_eps=1000", "delta_val_loss"] > 0.05
    assert table.loc["train.opt.workers=0", "verdict"] == "NO EFFECT"
    # exact and deterministic: the same score to the last digit
    assert table.loc["train.opt.workers=0", "delta_val_loss"] == 0.0
    assert not table["kept"].iloc[1:].any()


def test_cumulative_mode_keeps_a_pass_for_the_following_rows(tiny):
    result = run(tiny, ["train.opt.fused_loss=true", "train.opt.workers=0"])
    table = result.table.set_index("switch")
    fused = table.loc["train.opt.fused_loss=true"]
    assert fused["verdict"] == "PASS" and fused["kept"] and fused["speedup"] == 2.0
    assert abs(fused["delta_val_loss"]) <= fused["tolerance"]
    # the next change is measured on top of the fused loss: both run at the fused loss's speed
    after = table.loc["train.opt.workers=0"]
    assert after["against"] == "baseline + train.opt.fused_loss=true"
    assert after["verdict"] == "NO EFFECT" and after["base_step_ms"] == 500.0
    final = table.loc["final: train.opt.fused_loss=true"]
    assert final["verdict"] == "PASS" and final["speedup"] == 2.0
    assert result.info["kept"] == ["train.opt.fused_loss=true"]


def test_one_at_a_time_mode_measures_every_change_against_the_baseline(tiny):
    result = run(tiny, ["train.opt.fused_loss=true", "train.opt.workers=0"], mode="one_at_a_time")
    table = result.table.set_index("switch")
    assert (table["against"] == "baseline").all() and not table["kept"].iloc[1:].any()
    assert table.loc["train.opt.fused_loss=true", "verdict"] == "PASS"
    assert table.loc["train.opt.workers=0", "base_step_ms"] == 1000.0
    assert len(table) == 3  # no final row: nothing accumulated


def test_peak_memory_is_measured_per_variant(tiny):
    result = run(tiny, ["model.checkpointing=true"])
    table = result.table.set_index("switch")
    assert table.loc["baseline", "peak_memory_kind"] != "not measured"
    # recomputing the block in the backward pass keeps fewer activations
    assert table.loc["model.checkpointing=true", "peak_memory_mib"] < table.loc["baseline", "peak_memory_mib"]


def test_a_variant_that_cannot_run_fails_its_row_only(tiny):
    # float8 needs a CUDA GPU: its row fails with the one-line reason, and the rows after it run;
    # another architecture runs, approximate, its weights not all from the checkpoint
    result = run(tiny, ["train.opt.fp8=all", "model.mixer=deltanet", "train.opt.workers=0"])
    table = result.table.set_index("switch")
    fp8 = table.loc["train.opt.fp8=all"]
    assert fp8["verdict"] == "FAIL"
    assert fp8["note"].startswith("ParamsError: train.opt.fp8: needs a CUDA GPU")
    assert "\n" not in fp8["note"]
    other = table.loc["model.mixer=deltanet"]
    assert other["kind"] == "approximate" and "weights loaded" in other["note"]
    assert math.isfinite(other["delta_val_loss"])
    assert table.loc["train.opt.workers=0", "verdict"] == "NO EFFECT"


def test_an_exact_switch_of_a_latent_model_keeps_the_score_to_the_last_digit(tiny):
    # the inner loop draws noise at every training step: both runners must draw the same
    latent = {"model": {**TINY["model"], "n_latent": 2},
              "train": {**TINY["train"], "counterpart": {"enabled": False},
                        "latent": {"steps": 2, "eval_steps": [2], "eval_batches": 1}}}
    cfg = AblateConfig(**{**QUICK, "warm_start_steps": 5, "switches": ["train.opt.workers=0"]})
    # the warm start's initial weights come from the global generator: seeded, the probe below
    # does not depend on the tests that ran before (a 1-ulp nudge of a tiny model can also leave
    # its score unchanged to the last digit)
    torch.manual_seed(0)
    result = ablate(cfg, latent, str(tiny / "cache"), None, timer=fake_timer)
    row = result.table.set_index("switch").loc["train.opt.workers=0"]
    assert row["delta_val_loss"] == 0.0 and row["verdict"] == "NO EFFECT"
    # the rounding probe ran (a latent model): exact switches are allowed rounding_factor (3) x
    # its delta, never less than exact_tolerance. The delta itself may be 0 for so tiny a model
    # and so few steps (a 1-ulp nudge can leave its score unchanged to the last digit)
    probe = result.info["rounding_probe"]
    assert probe is not None
    assert row["tolerance"] == max(QUICK.get("exact_tolerance", 0.001), 3 * probe)


def test_a_plain_model_has_no_rounding_probe(tiny):
    result = run(tiny, ["train.opt.workers=0"])
    assert result.info["rounding_probe"] is None
    assert result.table.set_index("switch").loc["train.opt.workers=0", "tolerance"] == 0.001


def test_a_spent_time_budget_skips_the_later_rows(tiny):
    # the deadline is already past: the first row is not measured either, the baseline still is
    cfg = AblateConfig(**{**QUICK, "switches": ["train.opt.fused_loss=true", "train.opt.workers=0"]})
    result = ablate(cfg, TINY, str(tiny / "cache"), tiny / "checkpoints", timer=fake_timer,
                    deadline=time.monotonic() - 1.0)
    table = result.table.set_index("switch")
    assert table.loc["baseline", "verdict"] == "BASELINE"
    assert list(table["verdict"].iloc[1:]) == ["SKIPPED", "SKIPPED"]
    assert (table["note"].iloc[1:] == "time budget spent").all()


def test_loss_panel_zooms_to_the_differences():
    table = pd.DataFrame({"switch": ["baseline", "a=1", "b=2"], "verdict": ["BASELINE", "PASS", "FAIL"],
                          "speedup": [1.0, 1.2, 1.1], "speedup_low": [1.0, 1.1, 1.0],
                          "speedup_high": [1.0, 1.3, 1.2], "tolerance": [0.0, 0.001, 0.05],
                          "delta_val_loss": [0.0, 0.0004, 2.5], "val_loss": [4.0, 4.0004, 6.5]})
    fig = ablate_figure(table)
    speed, loss = fig.axes
    assert speed.get_xscale() == "linear" and loss.get_xscale() == "linear"
    low, high = loss.get_xlim()
    # spans the tolerances, not the failed row's 2.5 nor the loss from 0
    assert -0.1 < low < 0 < high < 0.1
