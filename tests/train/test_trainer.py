"""ltm.train.trainer: a short run learns and writes its metrics; every switch, compile, DDP, the
stage's outputs and the levers in the training loop."""
import dataclasses
import json
import math
import sys

import pytest
import torch

from ltm.latent.posterior import LatentConfig
from ltm.model.lm import ModelConfig
from ltm.params import ParamsError
from ltm.stages import train as train_module
from ltm.stages.train import train_stage
from ltm.train import checkpoint as ckpt
from ltm.train.settings import TrainConfig
from ltm.train.trainer import Trainer, run_training
from tests.train.trainer_cases import cache_dir, one_thread  # noqa: F401 (fixtures)
from tests.train.trainer_cases import (LATENT_RUN, cli, curve, rel_diff, run_to_completion, tiny,
                                      train_losses, write_params)


def test_a_short_run_learns_and_writes_metrics_and_curves(cache_dir, tmp_path):
    model_cfg, cfg = tiny(steps=30, eval_every=10, lr=1e-2, batch_size=8)
    result = run_training(model_cfg, cfg, cache_dir, str(tmp_path / "ckpt"), progress=False)
    losses = train_losses(result)
    assert len(losses) == 30 and losses[-1] < losses[0] - 1.0, f"no learning: {losses}"
    val_steps = [r["step"] for r in result.history if r["split"] == "val"]
    assert val_steps == [10, 20, 30]
    m = result.metrics
    assert m["steps"] == 30 and m["val_loss"] == result.history[-1]["loss"]
    assert m["tokens_per_step"] == 8 * 16 and m["tokens_per_s"] > 0 and m["timed_steps"] == 29
    assert m["mfu"] is None and 0 <= m["data_wait_fraction"] < 1 and m["peak_memory_mib"] > 0
    assert m["params"] > m["params_non_embedding"] > 0
    assert (tmp_path / "ckpt" / ckpt.CHECKPOINT_FILE).is_file()


def test_kernel_auto_records_what_each_op_ran(cache_dir, tmp_path):
    """On the CPU auto runs the chunked PyTorch form; the metrics say so per op and class."""
    model_cfg, cfg = tiny("deltanet", steps=2)
    model_cfg = dataclasses.replace(model_cfg, kernel="auto")
    choices = run_training(model_cfg, cfg, cache_dir, str(tmp_path / "ckpt"),
                           progress=False).metrics["kernel_choices"]
    ops = {(c["op"], c["pass"], c["T"], c["impl"]) for c in choices}
    assert ("delta_rule", "training", "<=512", "torch") in ops
    assert all(c["impl"] == "torch" and c["why"] == "not on CUDA" for c in choices)
    plain = run_training(tiny("deltanet", steps=2)[0], cfg, cache_dir, str(tmp_path / "plain"),
                         progress=False)
    assert "kernel_choices" not in plain.metrics


def test_gradient_accumulation_equals_one_big_batch(cache_dir, tmp_path):
    model_cfg, big = tiny(batch_size=8, grad_accum=1, eval_every=3)
    seed = big.seed
    _, small = tiny(batch_size=2, grad_accum=4, seed=seed, eval_every=3)
    whole = run_training(model_cfg, big, cache_dir, str(tmp_path / "a"), progress=False).history
    parts = run_training(model_cfg, small, cache_dir, str(tmp_path / "b"), progress=False).history
    assert [r["split"] for r in parts] == ["train"] * 3 + ["val"]
    # same rows, same weights; float32 sums in another order; validation on the same rows too
    whole, parts = [r["loss"] for r in whole], [r["loss"] for r in parts]
    assert rel_diff(parts, whole) < 1e-5, f"{parts} vs {whole} (seed {seed})"


def test_fused_loss_trains_like_the_plain_loss(cache_dir, tmp_path):
    model_cfg, plain = tiny(opt={"fused_loss": False})
    _, fused = tiny(seed=plain.seed, opt={"fused_loss": True})
    a = train_losses(run_training(model_cfg, plain, cache_dir, str(tmp_path / "a"), progress=False))
    b = train_losses(run_training(model_cfg, fused, cache_dir, str(tmp_path / "b"), progress=False))
    assert rel_diff(b, a) < 1e-5, f"{b} vs {a} (seed {plain.seed})"


@pytest.mark.parametrize("mixer,opt", [
    ("attention", {"amp": "bf16"}), ("attention", {"amp": "fp16"}),
    ("attention", {"fused_adamw": True, "tf32": True}), ("deltanet", {"workers": 2}),
    ("rwkv7", {"pretokenized": False}), ("attention", {"pin_memory": True, "fused_loss": True}),
], ids=["amp-bf16", "amp-fp16", "fused-adamw-tf32", "workers2-deltanet", "raw-text-rwkv7",
        "pin-memory-fused-loss"])
def test_each_switch_runs_on_the_cpu(cache_dir, tmp_path, mixer, opt):
    model_cfg, cfg = tiny(mixer, eval_every=3, opt=opt)
    result = run_training(model_cfg, cfg, cache_dir, str(tmp_path), progress=False)
    losses = train_losses(result)
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses), losses
    assert math.isfinite(result.metrics["val_loss"])
    switches = result.metrics["switches"]
    for key, value in opt.items():
        expected = False if key in ("pin_memory", "tf32") else value  # CUDA-only switches
        assert switches[key] == expected, (key, switches)


def test_batch_size_auto_falls_back_on_the_cpu(cache_dir, tmp_path, capsys):
    model_cfg, cfg = tiny(batch_size="auto", steps=1)
    result = run_training(model_cfg, cfg, cache_dir, str(tmp_path), progress=False)
    assert result.metrics["batch_size"] == 16
    assert "memory is not probed on the CPU" in capsys.readouterr().out


# torch.compile is on by default on CUDA: its CPU counterpart runs in CI, not behind a variable
def test_compile_trains_like_eager(cache_dir, tmp_path):
    model_cfg, eager = tiny()
    _, compiled = tiny(seed=eager.seed, opt={"compile": True})
    a = train_losses(run_training(model_cfg, eager, cache_dir, str(tmp_path / "a"), progress=False))
    b = train_losses(run_training(model_cfg, compiled, cache_dir, str(tmp_path / "b"), progress=False))
    assert rel_diff(b, a) < 1e-4, f"{b} vs {a} (seed {eager.seed})"


def test_two_ddp_processes_match_one_on_the_same_global_batch(cache_dir, tmp_path):
    model = dict(n_layers=2, d_model=32, n_heads=2, max_seq_len=32)
    train = dict(steps=3, batch_size=8, seq_len=16, warmup_steps=1, eval_every=3, eval_batches=2,
                 log_every=1, resume=False, seed=int(torch.randint(0, 2**31, (1,))))
    one = write_params(tmp_path / "one.yaml", cache_dir, model, train)
    # each process: 2 micro-steps of 2 sequences, so no_sync between them is exercised too
    two = write_params(tmp_path / "two.yaml", cache_dir, model,
                       {**train, "batch_size": 2, "grad_accum": 2})
    train_stage(one, str(tmp_path / "one" / "ckpt"), tmp_path / "one" / "train.json",
                tmp_path / "one" / "loss.csv", progress=False)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    run_to_completion(torchrun + cli(two, tmp_path / "two")[1:])
    single = json.loads((tmp_path / "one" / "train.json").read_text())
    ddp = json.loads((tmp_path / "two" / "train.json").read_text())
    assert ddp["world_size"] == 2 and ddp["tokens_per_step"] == single["tokens_per_step"]
    rows = [[loss for _, loss in curve(tmp_path / d / "loss.csv") + curve(tmp_path / d / "val_loss.csv")]
            for d in ("one", "two")]
    assert len(rows[0]) == 4 and rel_diff(rows[1], rows[0]) < 1e-5, f"{rows} (seed {train['seed']})"


def test_a_latent_model_trains_under_ddp(cache_dir, tmp_path):
    # each process fits the posteriors of its own sequences; their noise comes from each
    # process's generator, so the run is not the single-process one to rounding: it must run,
    # reduce its bound over both processes and stay finite
    model = dict(n_layers=1, d_model=32, n_heads=2, max_seq_len=32, n_latent=2)
    train = dict(steps=2, batch_size=2, seq_len=16, warmup_steps=1, eval_every=2, eval_batches=2,
                 log_every=1, resume=False, **LATENT_RUN)
    params = write_params(tmp_path / "two.yaml", cache_dir, model, train)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    run_to_completion(torchrun + cli(params, tmp_path / "two")[1:])
    ddp = json.loads((tmp_path / "two" / "train.json").read_text())
    assert ddp["world_size"] == 2 and ddp["n_latent"] == 2
    assert math.isfinite(ddp["val_nelbo"]) and ddp["val_nelbo"] > ddp["val_nll_given_fitted_z"]


def test_train_stage_reads_params_and_writes_outputs(cache_dir, tmp_path):
    params = write_params(tmp_path / "params.yaml", cache_dir,
                          dict(n_layers=1, d_model=32, n_heads=2, max_seq_len=32),
                          dict(steps=2, batch_size=2, seq_len=16, eval_batches=1, resume=False))
    result = train_stage(params, str(tmp_path / "ckpt"), tmp_path / "m" / "train.json",
                         tmp_path / "p" / "train_loss.csv",
                         overrides=["model.mixer=deltanet", "train.steps=3", "train.lr=1e-3"],
                         progress=False)
    assert result.metrics["mixer"] == "deltanet" and result.metrics["steps"] == 3
    assert json.loads((tmp_path / "m" / "train.json").read_text())["steps"] == 3
    lines = (tmp_path / "p" / "train_loss.csv").read_text().split()
    assert lines[0] == "step,seconds,loss" and lines[-1].startswith("3,") and len(lines) == 4
    val = (tmp_path / "p" / "val_loss.csv").read_text().split()
    assert val[0] == "step,seconds,loss,train_seconds,tokens" and val[1].startswith("3,")
    assert len(val) == 2
    seconds = [float(line.split(",")[1]) for line in lines[1:]]
    assert seconds == sorted(seconds) and seconds[0] >= 0
    with pytest.raises(ParamsError, match="--set: 'train' is not of the form section.key=value"):
        train_stage(params, str(tmp_path / "ckpt"), tmp_path / "m.json", tmp_path / "p.csv",
                    overrides=["train"], progress=False)


def test_latent_thoughts_train_the_cross_attention(cache_dir, tmp_path):
    model_cfg, cfg = tiny(steps=2, latent=LatentConfig(steps=2), opt={"fused_loss": True})
    model_cfg = ModelConfig(**{**model_cfg.__dict__, "n_latent": 2})
    trainer = Trainer(model_cfg, cfg, cache_dir, str(tmp_path), progress=False)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if ".cross." in n}
    result = trainer.run()
    assert all(math.isfinite(v) for v in train_losses(result))
    assert math.isfinite(result.metrics["val_loss"])
    after = dict(trainer.model.named_parameters())
    unchanged = [n for n in before if torch.equal(before[n], after[n])]
    assert before and not unchanged, f"cross-attention not trained: {unchanged}"


# --- the levers (ltm.train.optimizers, float8, fused_ops, time_to_target) in the training loop ------------------------------

def test_fp8_on_the_cpu_is_a_one_line_error(cache_dir, tmp_path):
    model_cfg, cfg = tiny(opt={"fp8": True})
    with pytest.raises(ParamsError, match=r"^train.opt.fp8: needs a CUDA GPU of compute capability"):
        run_training(model_cfg, cfg, cache_dir, str(tmp_path), progress=False)


def test_fused_ops_train_like_the_plain_model(cache_dir, tmp_path):
    # one sequence a step: the ops' Triton kernels run in the interpreter here, and what is
    # compared (the losses, step by step) does not need a batch
    model_cfg, plain = tiny(steps=3, batch_size=1)
    _, fused = tiny(steps=3, batch_size=1, seed=plain.seed,
                    opt={"fused_ops": ["rms_norm", "swiglu", "rope", "cross_entropy"]})
    a = train_losses(run_training(model_cfg, plain, cache_dir, str(tmp_path / "a"), progress=False))
    b = train_losses(run_training(model_cfg, fused, cache_dir, str(tmp_path / "b"), progress=False))
    assert rel_diff(b, a) < 1e-5, f"{b} vs {a} (seed {plain.seed})"


def test_muon_learns_and_resumes_bit_exact(cache_dir, tmp_path, monkeypatch):
    model_cfg, cfg = tiny(steps=4, optimizer="muon", lr=1e-2, muon_lr=0.02, resume=True,
                          checkpoint_every=2, eval_every=2)
    whole = run_training(model_cfg, cfg, cache_dir, str(tmp_path / "whole"), progress=False)
    losses = train_losses(whole)
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0], losses
    assert whole.metrics["optimizer"] == "muon"
    saved = ckpt.load_checkpoint(tmp_path / "whole" / ckpt.CHECKPOINT_FILE)
    assert set(saved["optimizer"]["state"]) == {"muon", "adamw"}
    # stopped after the checkpoint of step 2, then resumed to the end: the same losses as one run
    step = Trainer.train_step

    def stop_after_two(self, *args):
        if self.step == 2:
            raise KeyboardInterrupt
        step(self, *args)

    monkeypatch.setattr(Trainer, "train_step", stop_after_two)
    with pytest.raises(KeyboardInterrupt):
        run_training(model_cfg, cfg, cache_dir, str(tmp_path / "split"), progress=False)
    monkeypatch.setattr(Trainer, "train_step", step)
    resumed = run_training(model_cfg, cfg, cache_dir, str(tmp_path / "split"), progress=False)
    assert train_losses(resumed) == losses


def test_time_to_target_is_recorded_and_written(cache_dir, tmp_path):
    model_cfg, cfg = tiny(steps=6, eval_every=2, lr=1e-2, target_loss=100.0)
    result = run_training(model_cfg, cfg, cache_dir, str(tmp_path / "ckpt"), progress=False)
    m = result.metrics
    assert m["target_loss"] == 100.0 and m["steps_to_target"] == 2
    assert m["tokens_to_target"] == 2 * 4 * 16 and 0 < m["time_to_target_s"] <= m["seconds"]
    never = run_training(model_cfg, TrainConfig(**{**cfg.__dict__, "target_loss": 0.0}), cache_dir,
                         str(tmp_path / "never"), progress=False).metrics
    assert never["time_to_target_s"] is None and never["tokens_to_target"] is None
    train_module.write_outputs(result, tmp_path / "train.json", tmp_path / "loss.csv")
    val = (tmp_path / "val_loss.csv").read_text().split()
    assert val[0] == "step,seconds,loss,train_seconds,tokens" and len(val) == 4
    rows = [line.split(",") for line in val[1:]]
    # training seconds leave evaluations out: never more than the wall clock
    assert all(float(r[3]) <= float(r[1]) for r in rows) and [int(r[4]) for r in rows] == [128, 256, 384]


def test_data_auto_uses_the_cache_when_there_is_one(cache_dir, tmp_path, capsys):
    from ltm.data.batches import resolve_data
    assert resolve_data("auto", cache_dir, print) == "cache"
    assert resolve_data("auto", str(tmp_path / "none"), print) == "synthetic"
    assert "random tokens" in capsys.readouterr().out
    assert resolve_data("synthetic", cache_dir, print) == "synthetic"


def test_an_encoder_run_trains_saves_and_reports_its_encoder(cache_dir, tmp_path):
    latent = LatentConfig(steps=2, init="encoder", eval_steps=[0, 2], iwae_samples=[1, 4])
    model_cfg, cfg = tiny(steps=2, latent=latent, checkpoint_every=2)
    model_cfg = ModelConfig(**{**model_cfg.__dict__, "n_latent": 2})
    trainer = Trainer(model_cfg, cfg, cache_dir, str(tmp_path), progress=False)
    head = trainer.model.encoder.head.weight.detach().clone()
    result = trainer.run()
    assert not torch.equal(head, trainer.model.encoder.head.weight), "the encoder did not train"
    m = result.metrics
    assert set(m["val_iwae_by_samples"]) == {1, 4} and m["val_iwae_steps"] == 2
    assert all(math.isfinite(v) for v in m["val_nelbo_by_steps"].values())
    loaded = ckpt.load_model(tmp_path)
    assert torch.equal(loaded.encoder.head.weight, trainer.model.encoder.head.weight)
