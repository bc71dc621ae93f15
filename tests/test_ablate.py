import json
import time

import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.figure import Figure

from ltm.ablate import AblateConfig, ablate, ablate_stage, apply_switch, describe_change
from ltm.cache import DataConfig, build_cache
from ltm.figures import ablate_figure, profile_figure
from ltm.params import ParamsError, from_mapping
from ltm.profile import GROUPS
from ltm.train_config import load_configs
from ltm.trainer import run_training

SECTIONS = {"model": {"mixer": "attention", "kernel": "torch"}, "train": {"opt": {"amp": "off"}}}
TINY = {"model": {"n_layers": 1, "d_model": 32, "n_heads": 2, "max_seq_len": 32},
        "train": {"batch_size": 4, "seq_len": 32, "warmup_steps": 2, "eval_batches": 1}}
# few, short measurements: the verdicts below come from the fake timer, never from real speed
QUICK = dict(warmup=1, steps=2, repeats=2, val_sequences=8, profile_steps=0, warm_start_steps=30)


def test_switch_applies_one_or_more_assignments_to_a_copy():
    changed = apply_switch(SECTIONS, "model.mixer=deltanet model.kernel=naive train.opt.amp=bf16", "s")
    assert changed["model"] == {"mixer": "deltanet", "kernel": "naive"}
    assert changed["train"]["opt"]["amp"] == "bf16"
    assert SECTIONS["model"]["mixer"] == "attention"


@pytest.mark.parametrize("switch, message", [
    ("data.vocab_size=10", "must change the model or train section"),
    ("model.mixer", "not of the form section.key=value"),
    ("model.mixer.x=1", "goes below the plain value"),
])
def test_bad_switches_are_one_line_errors(switch, message):
    with pytest.raises(ParamsError, match=message):
        apply_switch(SECTIONS, switch, "ablate.switches[0]")


def test_each_switch_declares_its_kind_and_tolerance():
    cfg = AblateConfig(exact_tolerance=0.001, loss_tolerance=0.05,
                       registry={"model.norm_eps": {"kind": "approximate", "tolerance": 0.2}})
    fused = describe_change("train.opt.fused_loss=true", cfg, "s")
    assert (fused.kind, fused.tolerance) == ("exact", 0.001)
    # one approximate assignment makes the change approximate
    mixed = describe_change("model.mixer=deltanet model.kernel=naive", cfg, "s")
    assert (mixed.kind, mixed.tolerance) == ("approximate", 0.05)
    assert describe_change("model.norm_eps=1", cfg, "s").tolerance == 0.2
    with pytest.raises(ParamsError, match="'model.init_std' is not in the switch registry"):
        describe_change("model.init_std=0.1", AblateConfig(), "ablate.switches[0]")


def test_a_bad_registry_entry_is_a_one_line_error():
    with pytest.raises(ParamsError, match=r"ablate.registry.model.x: expected \{kind"):
        from_mapping(AblateConfig, {"registry": {"model.x": {"kind": "maybe"}}}, "ablate")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A token cache and the train stage's checkpoint of the tiny model."""
    root = tmp_path_factory.mktemp("ablate")
    rng = np.random.default_rng(0)
    words = ["thou", "art", "more", "lovely", "and", "temperate", "rough", "winds", "do", "shake"]
    for i in range(6):
        (root / f"sonnet{i}.txt").write_text(" ".join(rng.choice(words, size=3000)))
    cfg = DataConfig(source=str(root), vocab_size=300, val_fraction=0.3, cache_dir=str(root / "cache"))
    build_cache(cfg, progress=False)
    params = root / "params.yaml"
    params.write_text(json.dumps({"data": {"cache_dir": str(root / "cache")}, **TINY}))
    model_cfg, train_cfg, cache_dir = load_configs(params, ["train.steps=30", "train.eval_every=30"])
    run_training(model_cfg, train_cfg, cache_dir, str(root / "checkpoints"), progress=False)
    return root


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
    # another architecture: its weights do not come from the checkpoint
    result = run(tiny, ["model.mixer=deltanet", "train.opt.workers=0"])
    table = result.table.set_index("switch")
    other = table.loc["model.mixer=deltanet"]
    # approximate: it fails only if its (partly untrained) loss is worse beyond its tolerance
    assert (other["verdict"] == "FAIL") == (other["delta_val_loss"] > other["tolerance"])
    assert other["kind"] == "approximate" and "weights loaded" in other["note"]
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
    assert probe is not None and probe >= 0
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


def test_time_budget_must_be_positive():
    with pytest.raises(ParamsError, match="time_budget_s: must be > 0 or null"):
        AblateConfig(time_budget_s=0)


def test_stage_warm_starts_without_a_checkpoint_and_writes_outputs(tiny, tmp_path):
    params = tmp_path / "params.yaml"
    ablate_section = {**QUICK, "profile_steps": 1, "warm_start_steps": 5,
                      "switches": ["train.opt.fused_loss=true"]}
    params.write_text(json.dumps({"data": {"cache_dir": str(tiny / "cache")}, **TINY,
                                  "ablate": ablate_section}))
    result = ablate_stage(params, tmp_path / "ablate.json", tmp_path / "ablate.csv",
                          tmp_path / "no-checkpoints")
    assert "a warm start of 5 steps" in result.info["baseline"]
    metrics = json.loads((tmp_path / "ablate.json").read_text())
    assert set(metrics) == {"baseline", "train.opt.fused_loss=true", "profile", "protocol"}
    assert metrics["train.opt.fused_loss=true"]["verdict"] in ("PASS", "NO EFFECT", "SLOWER", "FAIL")
    assert set(metrics["profile"]["baseline"]) == set(GROUPS)
    profile = result.profile.set_index("group")["ms"]
    assert profile["projections"] > 0 and profile["optimiser"] > 0 and profile["MLP"] > 0
    csv = pd.read_csv(tmp_path / "ablate.csv")
    assert list(csv["switch"]) == ["baseline", "train.opt.fused_loss=true"]
    assert isinstance(ablate_figure(csv), Figure) and isinstance(profile_figure(result.profile), Figure)


def test_bad_switch_fails_before_any_training(tiny, tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(f"data: {{cache_dir: {tiny / 'cache'}}}\nmodel: {{}}\ntrain: {{}}\n"
                      "ablate: {switches: [model.mixr=rwkv7]}\n")
    with pytest.raises(ParamsError, match=r"model.mixr: unknown parameter \(did you mean 'mixer'\?\)"):
        ablate_stage(params, tmp_path / "a.json", tmp_path / "a.csv")


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
