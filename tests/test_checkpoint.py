import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from ltm import checkpoint as ckpt


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


def test_rng_states_round_trip():
    state = ckpt.rng_state()
    draws = (random.random(), np.random.rand(), torch.rand(2))
    ckpt.set_rng_state(state)
    again = (random.random(), np.random.rand(), torch.rand(2))
    assert draws[:2] == again[:2] and torch.equal(draws[2], again[2])
    assert len(ckpt.all_rng_states()) == 1


def saved(model=None, train=None, world=1) -> dict:
    return {"world_size": world, "code": ckpt.code_fingerprint(), "model_cfg": model or {"d_model": 32, "mixer": "attention"},
            "train_cfg": train or {"steps": 10, "resume": True, "lr": 0.1, "opt": {"amp": "off"}}}


def test_resume_rule_allows_only_steps_and_resume_to_change():
    model, train = saved()["model_cfg"], saved()["train_cfg"]
    assert ckpt.resume_mismatch(saved(), model, {**train, "steps": 99, "resume": False}, 1) is None
    assert ckpt.resume_mismatch(saved(), {**model, "mixer": "rwkv7"}, train, 1) == \
        "model.mixer was 'attention', now 'rwkv7'"
    assert ckpt.resume_mismatch(saved(), model, {**train, "opt": {"amp": "bf16"}}, 1) == \
        "train.opt.amp was 'off', now 'bf16'"
    assert ckpt.resume_mismatch(saved(), model, {**train, "seed": 3}, 1) == "train.seed was None, now 3"
    assert "2 processes" in ckpt.resume_mismatch(saved(world=2), model, train, 1)


def test_a_checkpoint_of_other_code_is_not_resumed(tmp_path, monkeypatch):
    model, train = saved()["model_cfg"], saved()["train_cfg"]
    assert ckpt.resume_mismatch(dict(saved(), code="0" * 64), model, train, 1) == \
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
