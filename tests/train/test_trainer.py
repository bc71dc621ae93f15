import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from ltm.train import checkpoint as ckpt
from ltm.stages import train as train_module
from ltm.train import trainer as trainer_module
from ltm.data.cache import DataConfig, build_cache
from ltm.data.corpus import DataError
from ltm.latent.posterior import LatentConfig
from ltm.model.lm import ModelConfig
from ltm.params import ParamsError
from ltm.stages.train import train_stage
from ltm.train.settings import OptConfig, TrainConfig, TrainingDiverged
from ltm.train.trainer import Trainer, run_training

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    # on a shared two-core machine, two spinning OpenMP threads per process make tiny steps 10x
    # slower; one thread is also what the subprocesses below get
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield
    torch.set_num_threads(threads)


def write_corpus(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng()
    words = ["king", "queen", "crown", "sword", "night", "love", "death", "the", "of", "and"]
    for i in range(8):
        (root / f"doc{i}.txt").write_text(f"Document {i}.\n" + " ".join(rng.choice(words, 600)) + "\n")
    return root


def make_cache(corpus: Path, cache: Path, val_fraction: float = 0.25) -> str:
    build_cache(DataConfig(source=str(corpus), vocab_size=300, val_fraction=val_fraction,
                           shard_tokens=4096, cache_dir=str(cache)), progress=False)
    return str(cache)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    corpus = write_corpus(tmp_path_factory.mktemp("train_corpus"))
    return make_cache(corpus, tmp_path_factory.mktemp("train_cache"))


def tiny(mixer: str = "attention", **train) -> tuple[ModelConfig, TrainConfig]:
    opt = train.pop("opt", {})
    settings = dict(steps=3, batch_size=4, seq_len=16, warmup_steps=1, eval_every=100,
                    eval_batches=2, log_every=1, timing_warmup=1, resume=False,
                    seed=int(torch.randint(0, 2**31, (1,))), opt=OptConfig(**opt))
    settings.update(train)
    return (ModelConfig(mixer=mixer, n_layers=2, d_model=32, n_heads=2, max_seq_len=32),
            TrainConfig(**settings))


def train_losses(result) -> list[float]:
    return [r["loss"] for r in result.history if r["split"] == "train"]


def rel_diff(a: list[float], b: list[float]) -> float:
    a, b = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    return float((a - b).norm() / b.norm())


def write_params(path: Path, cache_dir: str, model: dict, train: dict) -> Path:
    path.write_text(yaml.safe_dump({"data": {"cache_dir": cache_dir}, "model": model, "train": train}))
    return path


def cli(params: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ltm.stages.train", "--params", str(params), "--out-dir", str(out / "ckpt"),
            "--metrics", str(out / "train.json"), "--plot", str(out / "loss.csv"), "--no-progress",
            *extra]


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


def run_to_completion(command: list[str]) -> None:
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def curve(path: Path) -> list[tuple[int, float]]:
    """(step, loss) rows of a loss-curve CSV (step,seconds,loss[,train_seconds,tokens]):
    wall-clock seconds differ between runs, the losses must not."""
    header, *lines = path.read_text().split()
    names = header.split(",")
    rows = [dict(zip(names, line.split(","))) for line in lines]
    return [(int(row["step"]), float(row["loss"])) for row in rows]


# a latent model too: its inner loop draws q's start and noise from the global generator, whose
# state the checkpoint must carry for the resumed run to fit the same posteriors
LATENT_RUN = dict(latent={"steps": 2, "eval_steps": [0, 2], "eval_batches": 1},
                  counterpart={"enabled": False})


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


def counterpart_params(tmp_path: Path, cache_dir: str, n_latent: int = 0, **counterpart) -> Path:
    settings = dict(n_latent=2, latent_steps=1, eval_steps=[0, 2], eval_batches=1,
                    max_equal_flops_steps=100)
    settings.update(counterpart)
    return write_params(tmp_path / "params.yaml", cache_dir,
                        dict(n_layers=1, d_model=32, n_heads=2, max_seq_len=32, n_latent=n_latent),
                        dict(steps=3, batch_size=2, seq_len=16, eval_batches=2, eval_every=100,
                             warmup_steps=1, latent={"steps": 2, "eval_steps": [0, 1]},
                             counterpart=settings))


def test_the_train_stage_compares_plain_and_latent_at_equal_tokens_and_flops(cache_dir, tmp_path,
                                                                             capsys):
    params = counterpart_params(tmp_path, cache_dir)
    out = tmp_path / "out"
    result = train_stage(params, str(tmp_path / "ckpt"), out / "train.json", out / "loss.csv",
                         progress=False)
    saved = json.loads((out / "train.json").read_text())
    assert saved["n_latent"] == 0 and saved["steps"] == 3  # the configured model's metrics
    rows = {r["model"]: r for r in saved["comparison"]}
    assert list(rows) == ["plain", "latent", "plain-equal-flops"]
    plain, latent, flops = rows.values()
    assert [r["kind"] for r in rows.values()] == ["plain", "latent", "plain"]
    assert latent["n_latent"] == 2 and latent["latent_steps"] == 1
    assert plain["tokens"] == latent["tokens"] == 3 * 2 * 16
    assert plain["val_loss_is"] == "NLL" and latent["val_loss_is"] == "NELBO bound"
    # the inner step costs FLOPs: the latent model more than the plain one per token, and the
    # plain model at equal FLOPs the first step count that reaches the latent model's
    assert latent["training_flops"] > plain["training_flops"]
    per_step = plain["training_flops"] / plain["steps"]
    assert flops["steps"] > plain["steps"] and flops["steps"] == saved["equal_flops_steps"]
    assert 0 <= flops["training_flops"] - latent["training_flops"] < per_step
    for row in rows.values():
        assert all(math.isfinite(row[k]) for k in ("val_loss", "val_prefix_nll", "val_prefix_ppl"))
    curves = saved["latent_model"]
    assert set(curves["val_nelbo_by_steps"]) == set(curves["val_prefix_nll_by_steps"]) == {"0", "2"}
    assert "reduced from train.latent.steps 2" in curves["note"]
    assert "the first 1 validation batches" in curves["note"]
    assert set(saved["counterparts"]) == {"latent", "plain-equal-flops"}
    # every model's curves side by side; the stage's own curves stay the configured model's
    table = [line.split(",") for line in (out / "compare_loss.csv").read_text().split()]
    assert table[0] == ["model", "split", "step", "seconds", "loss"]
    assert {(r[0], r[1]) for r in table[1:]} == {(m, s) for m in rows for s in ("train", "val")}
    assert len((out / "loss.csv").read_text().split()) == 4
    assert (tmp_path / "ckpt" / ckpt.CHECKPOINT_FILE).is_file()
    for folder in ("counterpart-latent", "counterpart-plain-equal-flops"):
        assert (tmp_path / "ckpt" / folder / ckpt.CHECKPOINT_FILE).is_file()
    # resumable: a second run trains nothing and reports the same
    capsys.readouterr()
    again = train_stage(params, str(tmp_path / "ckpt"), out / "train.json", out / "loss.csv",
                        progress=False)
    assert capsys.readouterr().out.count("nothing to train") == 3
    assert again.metrics["comparison"] == result.metrics["comparison"]


def test_a_latent_model_is_compared_with_plain_ones_and_the_cap_is_said(cache_dir, tmp_path):
    params = counterpart_params(tmp_path, cache_dir, n_latent=2, max_equal_flops_steps=3)
    out = tmp_path / "out"
    train_stage(params, str(tmp_path / "ckpt"), out / "train.json", out / "loss.csv",
                progress=False)
    saved = json.loads((out / "train.json").read_text())
    rows = saved["comparison"]
    assert [(r["model"], r["role"]) for r in rows] == [
        ("latent", "configured"), ("plain", "counterpart: equal tokens"),
        ("plain-equal-flops", "counterpart: equal FLOPs")]
    assert rows[0]["latent_steps"] == 2 and rows[1]["n_latent"] == 0
    assert rows[2]["skipped"].startswith("skipped: over the cap")
    assert "max_equal_flops_steps is 3" in rows[2]["skipped"]
    # the configured latent model's own curves are its train.latent.eval_steps over all batches
    assert set(saved["val_nelbo_by_steps"]) == {"0", "1"}
    assert set(saved["latent_model"]["val_nelbo_by_steps"]) == {"0", "1"}
    assert not (tmp_path / "ckpt" / "counterpart-plain-equal-flops").exists()


# a small prior (ltm.stages.prior) the train stage trains once its latent model is trained
PRIOR = {"patch": 4, "width": 16, "n_heads": 2, "depth": 1, "steps": 20, "batch_size": 8,
         "train_sequences": 24, "heldout_sequences": 8, "fit_batch": 8, "train_timesteps": 50,
         "sample_steps": 5, "checkpoint_every": 10, "warmup_steps": 2}


def test_models_trained_side_by_side_compare_as_those_trained_in_turn(cache_dir, tmp_path, capsys):
    out = tmp_path / "out"
    compared, priors = {}, {}
    for workers in (1, 2):
        (tmp_path / str(workers)).mkdir()
        params = counterpart_params(tmp_path / str(workers), cache_dir, workers=workers)
        params.write_text(yaml.safe_dump({**yaml.safe_load(params.read_text()), "prior": PRIOR}))
        capsys.readouterr()
        result = train_stage(params, str(tmp_path / str(workers) / "ckpt"), out / "train.json",
                             out / "loss.csv", progress=False,
                             prior_metrics_path=out / f"prior-{workers}.json")
        said = capsys.readouterr().out
        compared[workers] = result.metrics
        # the prior trained on the latent model once it was trained, its lines said here too
        priors[workers] = json.loads((out / f"prior-{workers}.json").read_text())
        assert priors[workers]["latent_model"] == "counterpart-latent"
        assert priors[workers]["steps"] == 20 and said.count("prior: started") == 1
        latent_done = said.index("trained 3 steps in", said.index("counterpart (latent"))
        assert said.index("prior: ") > said.index("val NLL bound")
        assert latent_done < said.index("prior: ")
        # the stage stamps how its tokens/s was measured
        assert result.metrics["models_at_once"] == workers
        assert json.loads((out / "train.json").read_text())["models_at_once"] == workers
        # each worker's summary line reaches this process (and so the notebook), once per model
        assert said.count("trained 3 steps") == 2 and said.count("trained ") == 3
        assert ("at once on 2 processes" in said) == (workers == 2)
    in_turn, side_by_side = compared[1], compared[2]
    assert side_by_side["equal_flops_steps"] == in_turn["equal_flops_steps"] > 3
    for a, b in zip(in_turn["comparison"], side_by_side["comparison"]):
        assert {k: a[k] for k in ("model", "role", "steps", "tokens", "training_flops")} == \
            {k: b[k] for k in ("model", "role", "steps", "tokens", "training_flops")}
        # the same seeds and batches; a worker's thread count may round differently
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-4)
    assert side_by_side["latent_model"]["val_nelbo_by_steps"].keys() == \
        in_turn["latent_model"]["val_nelbo_by_steps"].keys()
    # the same prior, whichever process trained it (up to the rounding of a thread count)
    assert priors[2]["eval_loss_heldout"] == pytest.approx(priors[1]["eval_loss_heldout"], rel=1e-3)
    # resumed in turn, the finished models keep how their own tokens/s was measured
    params = counterpart_params(tmp_path / "2", cache_dir, workers=1)
    again = train_stage(params, str(tmp_path / "2" / "ckpt"), out / "again.json", out / "loss.csv",
                        progress=False)
    assert "nothing to train" in capsys.readouterr().out
    assert again.metrics["models_at_once"] == 2
    assert again.metrics["tokens_per_s"] == side_by_side["tokens_per_s"]
    assert {r["model"]: r["tokens_per_s"] for r in again.metrics["comparison"]} == \
        {r["model"]: r["tokens_per_s"] for r in side_by_side["comparison"]}


def test_models_train_in_turn_on_a_gpu_under_torchrun_and_with_a_found_batch(monkeypatch):
    from ltm.train.counterpart import side_by_side_workers
    from ltm.train.settings import CounterpartConfig

    cpu = TrainConfig(device="cpu", counterpart=CounterpartConfig(workers=2))
    assert side_by_side_workers(cpu) == 2
    assert side_by_side_workers(dataclasses.replace(cpu, counterpart=CounterpartConfig(workers=1))) == 1
    assert side_by_side_workers(dataclasses.replace(cpu, batch_size="auto")) == 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert side_by_side_workers(dataclasses.replace(cpu, device="auto")) == 1
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert side_by_side_workers(cpu) == 1


def test_a_negative_counterpart_workers_is_a_one_line_error():
    from ltm.train.settings import CounterpartConfig

    with pytest.raises(ParamsError, match="workers: must be >= 0, got -1"):
        CounterpartConfig(workers=-1)


def test_counterparts_off_train_the_configured_model_alone(cache_dir, tmp_path):
    params = counterpart_params(tmp_path, cache_dir, enabled=False)
    params.write_text(yaml.safe_dump({**yaml.safe_load(params.read_text()), "prior": PRIOR}))
    out = tmp_path / "out"
    train_stage(params, str(tmp_path / "ckpt"), out / "train.json", out / "loss.csv",
                progress=False, prior_metrics_path=out / "prior.json")
    assert "comparison" not in json.loads((out / "train.json").read_text())
    # no latent model, so no prior: said in its metrics file, which is the stage's output
    assert "trained no latent model" in json.loads((out / "prior.json").read_text())["skipped"]
    assert (out / "compare_loss.csv").read_text().split() == ["model,split,step,seconds,loss"]
    assert [p.name for p in (tmp_path / "ckpt").iterdir() if p.is_dir()] == []


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
