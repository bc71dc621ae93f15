"""ltm.stages.ablate: the stage reads its section, warm-starts without a checkpoint, writes its
metrics and plot table, and fails on a bad switch before any training."""
import json

import pandas as pd
import pytest
from matplotlib.figure import Figure

from ltm.ablation.profiling import GROUPS
from ltm.params import ParamsError
from ltm.report.figures import ablate_figure, profile_figure
import ltm.stages.ablate as ablate_module
from ltm.stages.ablate import ablate_stage
from tiny_corpus import QUICK, TINY, cache_and_checkpoint



@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return cache_and_checkpoint(tmp_path_factory.mktemp("ablate-stage"), TINY)


def fused_loss_halves_the_step(runner, step):
    """The step timer: steps with the fused loss take half the time, so the verdict follows from
    the protocol's rule and the loss, never from a busy machine's clock."""
    step()
    return 0.5 if runner.trainer.sw.fused_loss else 1.0


def test_stage_warm_starts_without_a_checkpoint_and_writes_outputs(tiny, tmp_path, monkeypatch):
    real_ablate = ablate_module.ablate
    monkeypatch.setattr(ablate_module, "ablate",
                        lambda *a, **k: real_ablate(*a, **k, timer=fused_loss_halves_the_step))
    params = tmp_path / "params.yaml"
    ablate_section = {**QUICK, "profile_steps": 1, "warm_start_steps": 5,
                      "switches": ["train.opt.fused_loss=true"]}
    params.write_text(json.dumps({"data": {"cache_dir": str(tiny / "cache")}, **TINY,
                                  "ablate": ablate_section}))
    result = ablate_stage(params, tmp_path / "ablate.json", tmp_path / "ablate.csv",
                          tmp_path / "no-checkpoints")
    assert "a warm start of 5 steps" in result.info["baseline"]
    metrics = json.loads((tmp_path / "ablate.json").read_text())
    # an exact switch (the same loss to the tolerance) at half the step time passes, is kept,
    # and the final configuration gets a row and a profile
    assert metrics["train.opt.fused_loss=true"]["verdict"] == "PASS"
    final = ["final: train.opt.fused_loss=true"]
    assert set(metrics) == {"baseline", "train.opt.fused_loss=true", "profile", "protocol", *final}
    assert set(metrics["profile"]["baseline"]) == set(GROUPS)
    # a PASS adds the final configuration's profile beside the baseline's
    assert set(result.profile["config"]) == {"baseline", "final"}
    profile = result.profile[result.profile["config"] == "baseline"].set_index("group")["ms"]
    assert profile["projections"] > 0 and profile["optimiser"] > 0 and profile["MLP"] > 0
    csv = pd.read_csv(tmp_path / "ablate.csv")
    assert list(csv["switch"]) == ["baseline", "train.opt.fused_loss=true", *final]
    assert isinstance(ablate_figure(csv), Figure) and isinstance(profile_figure(result.profile), Figure)


def test_bad_switch_fails_before_any_training(tiny, tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(f"data: {{cache_dir: {tiny / 'cache'}}}\nmodel: {{}}\ntrain: {{}}\n"
                      "ablate: {switches: [model.mixr=rwkv7]}\n")
    with pytest.raises(ParamsError, match=r"model.mixr: unknown parameter \(did you mean 'mixer'\?\)"):
        ablate_stage(params, tmp_path / "a.json", tmp_path / "a.csv")
