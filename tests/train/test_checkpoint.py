import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ltm.latent.encoder import attach_encoder
from ltm.latent.posterior import LatentConfig
from ltm.model.lm import LTM, ModelConfig
from ltm.params import to_dict
from ltm.train import checkpoint as ckpt
from ltm.train.settings import TrainConfig


def test_atomic_save_replaces_the_old_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "run" / ckpt.CHECKPOINT_FILE
    assert ckpt.load_checkpoint(path) is None
    ckpt.save_checkpoint(path, {"step": 1, "w": torch.ones(3)})
    ckpt.save_checkpoint(path, {"step": 2, "w": torch.zeros(3)})
    saved = ckpt.load_checkpoint(path)
    assert saved["step"] == 2 and torch.equal(saved["w"], torch.zeros(3))
    assert sorted(os.listdir(path.parent)) == [ckpt.CHECKPOINT_FILE]


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / ckpt.CHECKPOINT_FILE
    ckpt.save_checkpoint(path, {"step": 1})

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("cannot pickle")

    with pytest.raises(RuntimeError, match="cannot pickle"):
        ckpt.save_checkpoint(path, {"step": 2, "bad": Unpicklable()})
    assert ckpt.load_checkpoint(path)["step"] == 1
    assert sorted(os.listdir(tmp_path)) == [ckpt.CHECKPOINT_FILE]


def test_rng_states_round_trip():
    state = ckpt.rng_state()
    draws = (random.random(), np.random.rand(), torch.rand(2))
    ckpt.set_rng_state(state)
    again = (random.random(), np.random.rand(), torch.rand(2))
    assert draws[:2] == again[:2] and torch.equal(draws[2], again[2])
    assert len(ckpt.all_rng_states()) == 1


DATA = "a" * 64  # the fingerprint of the token cache the checkpoint was trained on


def saved(model=None, train=None, world=1) -> dict:
    return {"world_size": world, "code": ckpt.code_fingerprint(), "data": DATA,
            "model_cfg": model or {"d_model": 32, "mixer": "attention"},
            "train_cfg": train or {"steps": 10, "resume": True, "lr": 0.1, "opt": {"amp": "off"}}}


def test_resume_rule_allows_only_steps_and_resume_to_change():
    model, train = saved()["model_cfg"], saved()["train_cfg"]
    assert ckpt.resume_mismatch(saved(), model, {**train, "steps": 99, "resume": False}, 1, DATA) is None
    assert ckpt.resume_mismatch(saved(), {**model, "mixer": "rwkv7"}, train, 1, DATA) == \
        "model.mixer was 'attention', now 'rwkv7'"
    assert ckpt.resume_mismatch(saved(), model, {**train, "opt": {"amp": "bf16"}}, 1, DATA) == \
        "train.opt.amp was 'off', now 'bf16'"
    assert ckpt.resume_mismatch(saved(), model, {**train, "seed": 3}, 1, DATA) == \
        "train.seed was None, now 3"
    assert "2 processes" in ckpt.resume_mismatch(saved(world=2), model, train, 1, DATA)


def test_a_checkpoint_of_other_data_is_not_resumed():
    # e.g. data.val_fraction changed: the cache is rebuilt, the model and train sections are not
    model, train = saved()["model_cfg"], saved()["train_cfg"]
    assert ckpt.resume_mismatch(saved(), model, train, 1, "b" * 64) == \
        "the token cache has changed since it was written"
    # a checkpoint from before the data were fingerprinted is not resumed either
    old = {k: v for k, v in saved().items() if k != "data"}
    assert ckpt.resume_mismatch(old, model, train, 1, DATA) == \
        "the token cache has changed since it was written"


def test_a_checkpoint_of_other_code_is_not_resumed(tmp_path, monkeypatch):
    model, train = saved()["model_cfg"], saved()["train_cfg"]
    assert ckpt.resume_mismatch(dict(saved(), code="0" * 64), model, train, 1, DATA) == \
        "the ltm code has changed since it was written"
    # the fingerprint follows the sources: a copy of the package with one edit gets another one
    copy = tmp_path / "ltm"
    copy.mkdir()
    source = Path(ckpt.__file__).read_text()
    (copy / "checkpoint.py").write_text(source)
    (copy / "model.py").write_text("x = 1\n")
    fingerprint = ckpt.code_fingerprint.__wrapped__
    monkeypatch.setattr(ckpt, "__file__", str(copy / "checkpoint.py"))
    before = fingerprint()
    (copy / "model.py").write_text("x = 2\n")
    assert fingerprint() != before and before != ckpt.code_fingerprint()


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_temp_files_of_killed_writers_are_removed_and_live_ones_kept(tmp_path):
    # what kill -9 during save_checkpoint leaves: the temp file of a process that is gone
    stale = tmp_path / f".{ckpt.CHECKPOINT_FILE}.{dead_pid()}.tmp"
    live = tmp_path / f".{ckpt.CHECKPOINT_FILE}.{os.getppid()}.tmp"  # another process, writing
    other = tmp_path / "notes.tmp"
    for path in (stale, live, other):
        path.write_bytes(b"partial")
    ckpt.save_checkpoint(tmp_path / ckpt.CHECKPOINT_FILE, {"step": 1})
    assert ckpt.remove_stale_temps(tmp_path) == [stale]
    assert sorted(p.name for p in tmp_path.iterdir()) == \
        sorted([live.name, other.name, ckpt.CHECKPOINT_FILE])
    assert ckpt.remove_stale_temps(tmp_path / "missing") == []


def test_finiteness_covers_weights_and_optimiser_state():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    assert ckpt.all_finite(model.state_dict(), optimizer.state_dict())
    state = optimizer.state_dict()
    state["state"][0]["exp_avg_sq"][0, 0] = float("inf")
    assert not ckpt.all_finite(model.state_dict(), state)
    weights = model.state_dict()
    weights["bias"][1] = float("nan")
    assert not ckpt.all_finite(weights, optimizer.state_dict())


def test_load_model_restores_the_encoder_of_a_run_that_had_one(tmp_path):
    cfg = ModelConfig(vocab_size=16, n_layers=1, d_model=32, n_heads=2, max_seq_len=32, n_latent=2)
    torch.manual_seed(0)
    model = attach_encoder(LTM(cfg), LatentConfig(init="encoder", encoder_layers=2))
    with torch.no_grad():
        model.encoder.head.weight.normal_()  # not the zeros a fresh encoder has
    for name, latent in (("enc", LatentConfig(init="encoder", encoder_layers=2)),
                         ("plain", LatentConfig())):
        state = model.state_dict() if name == "enc" else LTM(cfg).state_dict()
        ckpt.save_checkpoint(tmp_path / name / ckpt.CHECKPOINT_FILE, {
            "model": state, "model_cfg": to_dict(cfg),
            "train_cfg": to_dict(TrainConfig(latent=latent))})
    loaded = ckpt.load_model(tmp_path / "enc")
    assert loaded.encoder is not None and len(loaded.encoder.blocks) == 2
    assert set(loaded.state_dict()) == set(model.state_dict())
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    assert ckpt.load_model(tmp_path / "plain").encoder is None
