"""ltm.train.trainer: nothing lost on a crash: a NaN, a divergence, SIGKILL and resume, a corrupt
or changed cache, bad lengths, half-written checkpoints, one-line command-line errors."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ltm.data.corpus import DataError
from ltm.model.lm import ModelConfig
from ltm.params import ParamsError
from ltm.stages import train as train_module
from ltm.stages.train import train_stage
from ltm.train import checkpoint as ckpt
from ltm.train import trainer as trainer_module
from ltm.train.settings import TrainConfig, TrainingDiverged
from ltm.train.trainer import Trainer, run_training
from tests.train.trainer_cases import cache_dir, one_thread  # noqa: F401 (fixtures)
from tests.train.trainer_cases import (LATENT_RUN, ROOT, cli, curve, make_cache, run_to_completion,
                                      tiny, train_losses, write_corpus, write_params)


def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(cache_dir, tmp_path, monkeypatch):
    model_cfg, cfg = tiny(steps=6, checkpoint_every=2)
    train_step = Trainer.train_step

    def poisoned_step(self, batches, timing):
        if self.step == 3:
            with torch.no_grad():
                self.model.embed.weight[0, 0] = float("nan")
        train_step(self, batches, timing)

    monkeypatch.setattr(Trainer, "train_step", poisoned_step)
    with pytest.raises(TrainingDiverged, match=r"train loss is nan at step 4: stopped; the last "
                       r"good checkpoint, step 2, is kept"):
        run_training(model_cfg, cfg, cache_dir, str(tmp_path), progress=False)
    saved = ckpt.load_checkpoint(tmp_path / ckpt.CHECKPOINT_FILE)
    assert saved["step"] == 2
    assert all(torch.isfinite(t).all() for t in saved["model"].values())


def test_resume_only_when_the_configs_match(cache_dir, tmp_path, capsys):
    model_cfg, cfg = tiny(steps=2, resume=True)
    run_training(model_cfg, cfg, cache_dir, str(tmp_path), progress=False)
    longer = TrainConfig(**{**cfg.__dict__, "steps": 4})
    result = run_training(model_cfg, longer, cache_dir, str(tmp_path), progress=False)
    assert "resuming from" in capsys.readouterr().out and len(train_losses(result)) == 4
    again = run_training(model_cfg, longer, cache_dir, str(tmp_path), progress=False)
    assert "already holds all 4 steps" in capsys.readouterr().out and again.metrics == result.metrics
    shorter = TrainConfig(**{**cfg.__dict__, "steps": 3})
    run_training(model_cfg, shorter, cache_dir, str(tmp_path), progress=False)
    assert "it is at step 4, past train.steps=3; starting fresh" in capsys.readouterr().out
    changed = TrainConfig(**{**cfg.__dict__, "steps": 4, "lr": cfg.lr / 2})
    result = run_training(model_cfg, changed, cache_dir, str(tmp_path), progress=False)
    out = capsys.readouterr().out
    assert "not resuming" in out and "train.lr was 0.003, now 0.0015; starting fresh" in out
    assert [r["step"] for r in result.history if r["split"] == "train"] == [1, 2, 3, 4]


@pytest.mark.parametrize("n_latent", [0, 2])
def test_sigkill_then_resume_is_bit_exact(cache_dir, tmp_path, n_latent):
    model = dict(n_layers=2, d_model=32, n_heads=2, max_seq_len=32, n_latent=n_latent)
    train = dict(steps=24, batch_size=4, seq_len=16, warmup_steps=4, eval_every=12, eval_batches=2,
                 checkpoint_every=3, log_every=1, resume=True, seed=int(torch.randint(0, 2**31, (1,))),
                 **LATENT_RUN)
    params = write_params(tmp_path / "params.yaml", cache_dir, model, train)
    # the uninterrupted run in this process (one thread, as the subprocesses have)
    whole_dir = tmp_path / "whole"
    train_stage(params, str(whole_dir / "ckpt"), whole_dir / "train.json", whole_dir / "loss.csv",
                progress=False)

    killed = tmp_path / "killed"
    process = subprocess.Popen(cli(params, killed), cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    checkpoint = killed / "ckpt" / ckpt.CHECKPOINT_FILE
    # waits on the event (the first checkpoint, or the run's end); the limit only stops a hung
    # run, generous for a CI machine whose two cores are shared
    deadline = time.monotonic() + 900
    while not checkpoint.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    step = ckpt.load_checkpoint(checkpoint)["step"]
    assert 3 <= step < 24 and not (killed / "train.json").exists()

    run_to_completion(cli(params, killed))
    for name in ("loss.csv", "val_loss.csv"):
        assert curve(killed / name) == curve(whole_dir / name), \
            f"{name}: killed at step {step}, seed {train['seed']}"
    whole = json.loads((tmp_path / "whole" / "train.json").read_text())
    resumed = json.loads((killed / "train.json").read_text())
    assert resumed["val_loss"] == whole["val_loss"] and resumed["train_loss"] == whole["train_loss"]


def test_a_changed_token_cache_is_not_resumed(tmp_path, capsys):
    # the scenario: data.val_fraction 0.1 -> 0.2 rebuilds the cache, the train and model
    # sections stay the same, and the old checkpoint's val_loss must not be reported again
    corpus = write_corpus(tmp_path / "corpus")
    cache = make_cache(corpus, tmp_path / "cache", val_fraction=0.25)
    model_cfg, cfg = tiny(steps=2, eval_every=2, resume=True)
    first = run_training(model_cfg, cfg, cache, str(tmp_path / "ckpt"), progress=False)
    make_cache(corpus, tmp_path / "cache", val_fraction=0.5)
    capsys.readouterr()
    again = run_training(model_cfg, cfg, cache, str(tmp_path / "ckpt"), progress=False)
    out = capsys.readouterr().out
    assert (f"not resuming from {tmp_path / 'ckpt' / ckpt.CHECKPOINT_FILE}: the token cache has "
            "changed since it was written; starting fresh") in out
    assert "already holds" not in out and again.metrics["val_loss"] != first.metrics["val_loss"]


def finite_tensors(tree) -> list[bool]:
    if torch.is_tensor(tree):
        return [bool(torch.isfinite(tree).all())] if tree.is_floating_point() else []
    if isinstance(tree, dict):
        return [ok for value in tree.values() for ok in finite_tensors(value)]
    if isinstance(tree, (list, tuple)):
        return [ok for value in tree for ok in finite_tensors(value)]
    return []


def test_divergence_keeps_a_finite_checkpoint_and_resumes_from_it(cache_dir, tmp_path):
    # the scenario: lr 1e6, a checkpoint every step; the weights turn NaN in an update
    # whose loss (computed before it) was still finite
    model_cfg, cfg = tiny(steps=12, lr=1e6, warmup_steps=0, checkpoint_every=1, resume=True)
    with pytest.raises(TrainingDiverged) as err:
        run_training(model_cfg, cfg, cache_dir, str(tmp_path), progress=False)
    saved = ckpt.load_checkpoint(tmp_path / ckpt.CHECKPOINT_FILE)
    assert saved is not None, f"{err.value} (seed {cfg.seed})"
    assert f"the last good checkpoint, step {saved['step']}, is kept" in str(err.value)
    weights, moments = finite_tensors(saved["model"]), finite_tensors(saved["optimizer"]["state"])
    assert weights and moments and all(weights) and all(moments), f"seed {cfg.seed}"
    trainer = Trainer(model_cfg, cfg, cache_dir, str(tmp_path), progress=False)
    assert trainer.try_resume() is None and trainer.step == saved["step"]
    assert all(finite_tensors(trainer.model.state_dict()))
    assert all(finite_tensors(trainer.optimizer.state_dict()["state"]))


def flipped(cache_dir: str, dest: Path, offset: int) -> str:
    shutil.copytree(cache_dir, dest)
    shard = dest / "train_000.bin"
    data = bytearray(shard.read_bytes())
    data[offset] ^= 0x40
    shard.write_bytes(bytes(data))
    return str(dest)


@pytest.mark.parametrize("offset", [100, 101], ids=["low-byte", "high-byte"])
def test_a_corrupt_cache_stops_training_before_it_starts(cache_dir, tmp_path, offset):
    # uint16 tokens, little-endian: a flipped high byte makes an id far outside the vocabulary
    corrupt = flipped(cache_dir, tmp_path / "cache", offset)
    model_cfg, cfg = tiny(steps=2)
    with pytest.raises(DataError, match=r"train_000.bin: checksum does not match meta.json"):
        run_training(model_cfg, cfg, corrupt, str(tmp_path / "ckpt"), progress=False)


def test_lengths_are_checked_before_the_model_is_built(cache_dir, tmp_path, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was built before the configuration was checked")

    monkeypatch.setattr(trainer_module, "LTM", no_model)
    model_cfg, cfg = tiny(seq_len=64)
    with pytest.raises(ParamsError) as err:
        run_training(model_cfg, cfg, cache_dir, str(tmp_path), progress=False)
    assert str(err.value) == "train.seq_len: 64 is longer than model.max_seq_len=32"
    model_cfg = ModelConfig(**{**model_cfg.__dict__, "max_seq_len": 1 << 20})
    with pytest.raises(DataError, match=r"train.seq_len=100000 needs 100001 tokens in one shard"):
        run_training(model_cfg, TrainConfig(**{**cfg.__dict__, "seq_len": 100000}), cache_dir,
                     str(tmp_path), progress=False)


def test_temp_files_of_a_killed_checkpoint_write_are_removed_on_the_next_start(cache_dir,
                                                                               tmp_path):
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    tmp_path.joinpath(f".{ckpt.CHECKPOINT_FILE}.{process.pid}.tmp").write_bytes(b"partial")
    model_cfg, cfg = tiny(steps=1)
    run_training(model_cfg, cfg, cache_dir, str(tmp_path), progress=False)
    assert not list(tmp_path.glob("*.tmp")), sorted(os.listdir(tmp_path))


def main_error(monkeypatch, params: Path, out: Path, *extra: str) -> str:
    """What `python -m ltm.stages.train` would print (SystemExit's message goes to stderr, rc 1)."""
    monkeypatch.setattr(sys, "argv", cli(params, out, *extra)[2:])
    with pytest.raises(SystemExit) as exit_:
        train_module.main()
    assert isinstance(exit_.value.code, str), exit_.value.code
    return exit_.value.code


def test_every_command_line_error_is_one_line(cache_dir, tmp_path, monkeypatch):
    params = write_params(tmp_path / "params.yaml", cache_dir,
                          dict(n_layers=1, d_model=32, n_heads=2, max_seq_len=32),
                          dict(steps=1, batch_size=2, seq_len=16, eval_batches=1, resume=False))
    # the process as a user runs it: one line on stderr, exit status 1
    done = subprocess.run(cli(params, tmp_path, "--set", "trian.lr=1"), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stderr) == \
        (1, "error: --set: unknown section 'trian' in 'trian.lr=1' (did you mean 'train'?)\n")
    assert main_error(monkeypatch, params, tmp_path, "--set", "train.seq_len=64") == \
        "error: train.seq_len: 64 is longer than model.max_seq_len=32"
    too_long = main_error(monkeypatch, params, tmp_path, "--set", "train.seq_len=5000",
                          "--set", "model.max_seq_len=8192")
    assert "\n" not in too_long and "train.seq_len=5000 needs 5001 tokens" in too_long
    # anything else (here an unreadable meta.json): its type and first line, the traceback on ask
    broken = tmp_path / "broken"
    shutil.copytree(cache_dir, broken)
    (broken / "meta.json").write_text("{")
    params = write_params(tmp_path / "broken.yaml", str(broken),
                          dict(n_layers=1, d_model=32, n_heads=2, max_seq_len=32),
                          dict(steps=1, batch_size=2, seq_len=16, resume=False))
    message = main_error(monkeypatch, params, tmp_path)
    assert message.startswith("error: JSONDecodeError: ") and "\n" not in message
    assert message.endswith("(run with --debug for the traceback)")
    with pytest.raises(json.JSONDecodeError):
        monkeypatch.setattr(sys, "argv", cli(params, tmp_path, "--debug")[2:])
        train_module.main()


