import json

import numpy as np
import pytest

from ltm.ablate import AblateConfig, ablate_stage, apply_switch
from ltm.cache import DataConfig, build_cache
from ltm.params import ParamsError

SECTIONS = {"model": {"mixer": "attention", "kernel": "torch"}, "train": {"opt": {"amp": "off"}}}


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


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("ablate")
    rng = np.random.default_rng()
    words = ["thou", "art", "more", "lovely", "and", "temperate", "rough", "winds", "do", "shake"]
    for i in range(6):
        (root / f"sonnet{i}.txt").write_text(" ".join(rng.choice(words, size=3000)))
    cfg = DataConfig(source=str(root), vocab_size=300, val_fraction=0.3, cache_dir=str(root / "cache"))
    build_cache(cfg, progress=False)
    return root


def test_stage_runs_baseline_and_switch_and_writes_outputs(tiny_cache, tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(f"""
data: {{cache_dir: {tiny_cache / 'cache'}}}
model: {{n_layers: 1, d_model: 32, n_heads: 2, max_seq_len: 32}}
train: {{batch_size: 4, seq_len: 32, eval_batches: 2, warmup_steps: 1, log_every: 1, timing_warmup: 1}}
ablate: {{steps: 4, switches: ["model.mixer=deltanet model.kernel=naive"]}}
""")
    table = ablate_stage(params, tmp_path / "ablate.json", tmp_path / "ablate.csv")
    assert list(table["switch"]) == ["baseline", "model.mixer=deltanet model.kernel=naive"]
    # the switch's speed-up is its tokens/s over the baseline's, and it trained another model
    ratio = table["tokens_per_s"].iloc[1] / table["tokens_per_s"].iloc[0]
    assert table["speedup"].iloc[1] == pytest.approx(ratio, rel=1e-12)
    assert table["val_loss"].iloc[1] != table["val_loss"].iloc[0]
    assert (table["tokens_per_s"] > 0).all() and np.isfinite(table["val_loss"]).all()
    metrics = json.loads((tmp_path / "ablate.json").read_text())
    assert set(metrics) == set(table["switch"])
    assert (tmp_path / "ablate.csv").read_text().startswith("switch,")


def test_bad_switch_fails_before_any_training(tiny_cache, tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(f"data: {{cache_dir: {tiny_cache / 'cache'}}}\nmodel: {{}}\ntrain: {{}}\n"
                      "ablate: {switches: [model.mixr=rwkv7]}\n")
    with pytest.raises(ParamsError, match=r"model.mixr: unknown parameter \(did you mean 'mixer'\?\)"):
        ablate_stage(params, tmp_path / "a.json", tmp_path / "a.csv")
