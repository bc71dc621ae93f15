"""One training run (Trainer): AdamW or Muon with warm-up and cosine decay, gradient accumulation
and clipping, evaluation on the validation split, atomic resumable checkpoints, one process or
many (DDP). The settings are `ltm.train.settings`; the stage around it is `ltm.stages.train`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from ltm.train import checkpoint as ckpt
from ltm.data.batches import MicroBatches, check_data, check_lengths, open_source, with_vocab
from ltm.train.hardware import (allow_recompiles, autocast, find_batch_size, peak_flops, peak_memory,
                          setup_distributed)
from ltm.latent.encoder import attach_encoder
from ltm.latent.evaluate import validation_metrics
from ltm.data.batches import resolve_data
from ltm.train.float8 import convert_fp8
from ltm.train.time_to_target import time_to_target
from ltm.train.objective import LossModel
from ltm.model.lm import LTM, ModelConfig
from ltm.ops.auto import chosen as kernel_choices
from ltm.params import to_dict
from ltm.train.checkpoint import seed_everything
from ltm.train.optimizers import make_optimizer
from ltm.train.settings import resolve_switches, Switches, TrainConfig, TrainingDiverged, TrainResult

def _unwrap(loss_model: nn.Module) -> LossModel:
    """The LossModel inside torch.compile's and DDP's wrappers."""
    while not isinstance(loss_model, LossModel):
        loss_model = (loss_model._orig_mod if hasattr(loss_model, "_orig_mod")
                      else loss_model.module)
    return loss_model


def _val_pieces(val, cfg: TrainConfig, batch_size: int, device: torch.device, rank: int,
                world: int):
    """This process's share of the first eval_batches validation batches of one global batch each
    (batch_size * grad_accum * world sequences), in pieces (x, y) of at most batch_size rows."""
    share = batch_size * cfg.grad_accum
    for x, y in val.eval_batches(share * world, cfg.seq_len, cfg.eval_batches):
        for start in range(rank * share, min((rank + 1) * share, len(x)), batch_size):
            rows = slice(start, min(start + batch_size, (rank + 1) * share, len(x)))
            yield x[rows].to(device), y[rows].to(device)


@torch.no_grad()
def evaluate_metrics(loss_model: nn.Module, val, cfg: TrainConfig, batch_size: int, sw: Switches,
                     device: torch.device, rank: int, world: int, full: bool = False) -> dict:
    """ltm.latent.evaluate.validation_metrics of the validation pieces (see _val_pieces), token-weighted
    over all processes: the result does not depend on how the global batch is split (up to the
    latents' noise). A latent model (loss_model.uses_latents) is scored by the negative ELBO with
    q fitted by train.latent.steps inner steps; val_loss is that bound, never the NLL given the
    fitted z alone; a plain model's val_loss is its NLL. full: also the bound by inference steps
    (train.latent.eval_steps), split into NLL and KL, the importance-weighted bound
    (train.latent.iwae_samples) and the second half's NLL given the first half."""
    inner = _unwrap(loss_model)
    inner.eval()
    with autocast(device, sw.amp):
        metrics = validation_metrics(
            inner.model, inner.fitter if inner.uses_latents else None,
            _val_pieces(val, cfg, batch_size, device, rank, world), full=full,
            eval_steps=cfg.latent.eval_steps, samples=cfg.latent.eval_samples, seed=cfg.seed,
            reduce=dist.all_reduce if world > 1 else None, eval_batches=cfg.latent.eval_batches,
            iwae_samples=cfg.latent.iwae_samples)
    inner.train()
    return metrics


def evaluate(loss_model: nn.Module, val, cfg: TrainConfig, batch_size: int, sw: Switches,
             device: torch.device, rank: int, world: int) -> float:
    """The validation loss of evaluate_metrics: the NELBO bound per token for a latent model,
    the NLL per token for a plain one."""
    return evaluate_metrics(loss_model, val, cfg, batch_size, sw, device, rank, world)["val_loss"]


class Trainer:
    """One training run: built from the configs, then `run()` from the start or a checkpoint."""

    def __init__(self, model_cfg: ModelConfig, cfg: TrainConfig, cache_dir: str, out_dir: str,
                 progress: bool, stamp: dict | None = None) -> None:
        # how the run was measured (models_at_once, say): saved with its metrics, so that a
        # resumed finished run reports how its own tokens/s was measured
        self.stamp = dict(stamp or {})
        self.device, self.rank, self.world = setup_distributed(cfg.device)
        self.say = print if self.rank == 0 else (lambda *args: None)
        self.cfg, self.sw = cfg, resolve_switches(cfg.opt, self.device)
        # global state: set both ways, so that runs in one process do not leak into each other
        torch.set_float32_matmul_precision("high" if self.sw.tf32 else "highest")
        data = resolve_data(cfg.data, cache_dir, self.say)
        self.source = ("synthetic" if data == "synthetic"
                       else "cache" if self.sw.pretokenized else "raw")
        self.model_cfg = with_vocab(model_cfg, cache_dir, self.source)
        self.cache_dir, self.progress = cache_dir, progress
        self.path = Path(out_dir) / ckpt.CHECKPOINT_FILE
        # before any model is built or compiled: a bad length or a corrupt cache fails in seconds
        check_lengths(self.model_cfg, cfg.seq_len)
        stamp = self.path.with_name(ckpt.STAMP_FILE)
        self.data = check_data(self.source, cache_dir, cfg.seq_len, stamp)
        seed_everything(cfg.seed)
        self.model = LTM(self.model_cfg).to(self.device)
        if self.sw.fused_ops:
            from ltm.train.fused_ops import apply_fused_ops  # imports Triton: only when asked
            apply_fused_ops(self.model, self.sw.fused_ops)
        if self.sw.fp8 != "off":
            convert_fp8(self.model, self.device, self.sw.fp8)
        # after the speed conversions, which are the decoder's: the encoder (latent.init encoder)
        attach_encoder(self.model, cfg.latent)
        self.loss_model = LossModel(self.model, self.sw.fused_loss, self.sw.compile, cfg.latent,
                                    fused_ce="cross_entropy" in self.sw.fused_ops)
        self.batch_size = cfg.batch_size
        if cfg.batch_size == "auto":
            self.batch_size = find_batch_size(self.loss_model, cfg.seq_len, self.model_cfg.vocab_size,
                                              self.sw.amp, cfg.memory_fraction, self.device, self.say)
        self.optimizer, self.scheduler = make_optimizer(self.model, cfg, self.sw.fused_adamw,
                                                         self.sw.compile)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.sw.amp == "fp16")
        self.step, self.history, self.pending = 0, [], []
        # (perf_counter at the start, seconds of earlier runs): run() sets it after resuming
        self.clock = (time.perf_counter(), 0.0)
        self.last_saved: int | None = None
        # seconds spent on evaluation and checkpoints (timed_aside), kept out of train_seconds
        self.aside = 0.0
        # compile modes that capture CUDA graphs: each step is marked as a new replay
        self.graphs = self.sw.compile and self.sw.compile_mode in ("reduce-overhead", "max-autotune")
        self.step_model: nn.Module = self.loss_model
        if self.world > 1:
            # unused parameters: the latent cross-attention when training without z
            unused = self.model_cfg.n_latent > 0 and cfg.latent.steps == 0
            self.step_model = DistributedDataParallel(self.loss_model, find_unused_parameters=unused)
        if self.sw.compile:
            mode = None if self.sw.compile_mode == "default" else self.sw.compile_mode
            allow_recompiles()  # one process may compile many configurations (the ablate stage)
            self.step_model = torch.compile(self.step_model, mode=mode)

    def config_dicts(self) -> tuple[dict, dict]:
        return to_dict(self.model_cfg), to_dict(self.cfg)

    def try_resume(self) -> dict | None:
        """Load the checkpoint if resuming is asked for and it matches; its stored metrics if the
        run it holds is already complete."""
        if self.rank == 0 and ckpt.remove_stale_temps(self.path.parent):
            self.say(f"removed the temporary files of a killed checkpoint write in {self.path.parent}")
        saved = ckpt.load_checkpoint(self.path) if self.cfg.resume else None
        if saved is None:
            return None
        why = ckpt.resume_mismatch(saved, *self.config_dicts(), self.world, self.data)
        if why is None and saved["step"] > self.cfg.steps:
            why = f"it is at step {saved['step']}, past train.steps={self.cfg.steps}"
        if why is not None:
            self.say(f"not resuming from {self.path}: {why}; starting fresh")
            return None
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        self.scaler.load_state_dict(saved["scaler"])
        ckpt.set_rng_state(saved["rng"][self.rank])
        self.step, self.history, self.last_saved = saved["step"], saved["history"], saved["step"]
        self.aside = saved.get("aside_seconds", 0.0)
        self.say(f"resuming from {self.path} at step {self.step}")
        return saved["metrics"] if self.step >= self.cfg.steps else None

    def save(self, metrics: dict | None = None) -> None:
        self.flush()
        # a finite loss is computed before the update that may break the weights: check them
        if not ckpt.all_finite(self.model.state_dict(), self.optimizer.state_dict()["state"]):
            raise TrainingDiverged(f"the weights or optimiser state are not finite after step "
                                   f"{self.step}: stopped; {self.kept()}")
        rng = ckpt.all_rng_states()
        if self.rank == 0:
            ckpt.save_checkpoint(self.path, {
                "step": self.step, "next_micro_batch": self.step * self.cfg.grad_accum,
                "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
                "rng": rng, "history": self.history, "metrics": metrics, "aside_seconds": self.aside,
                "model_cfg": self.config_dicts()[0], "train_cfg": self.config_dicts()[1],
                "world_size": self.world, "code": ckpt.code_fingerprint(), "data": self.data})
        self.last_saved = self.step

    def loader(self):
        data = MicroBatches(self.source, self.cache_dir, self.model_cfg.vocab_size, self.cfg.seed,
                            self.cfg.seq_len, self.batch_size, self.cfg.grad_accum, self.rank,
                            self.world)
        first = self.step * self.cfg.grad_accum
        # the loader's own generator: drawing its workers' base seed from the global one would
        # shift the latent inner loop's noise after a resume (the batches need no seed of it)
        return iter(torch.utils.data.DataLoader(
            data, batch_size=None, sampler=range(first, self.cfg.steps * self.cfg.grad_accum),
            num_workers=self.sw.workers, pin_memory=self.sw.pin_memory,
            prefetch_factor=4 if self.sw.workers else None,
            generator=torch.Generator().manual_seed(self.cfg.seed + self.step)))

    def train_step(self, batches, timing: dict) -> None:
        """One optimiser step over grad_accum micro-batches."""
        if self.graphs:  # the previous step's graph outputs may be overwritten from here
            torch.compiler.cudagraph_mark_step_begin()
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(self.cfg.grad_accum):
            waited = time.perf_counter()
            x, y = next(batches)
            timing["data_wait"] += time.perf_counter() - waited
            x = x.to(self.device, non_blocking=self.sw.pin_memory)
            y = y.to(self.device, non_blocking=self.sw.pin_memory)
            last = micro == self.cfg.grad_accum - 1
            # between micro-steps DDP need not average gradients: only the last one syncs
            sync = contextlib.nullcontext() if self.world == 1 or last else self.step_model.no_sync()
            with sync, autocast(self.device, self.sw.amp):
                loss = self.step_model(x, y) / self.cfg.grad_accum
            self.scaler.scale(loss).backward()
            loss_sum += loss.detach().float()
        if self.cfg.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        self.pending.append((self.step, loss_sum, self.elapsed()))

    def flush(self) -> None:
        """Bring the pending train losses to the host (one wait for the device); stop on NaN/inf."""
        if not self.pending:
            return
        losses = torch.stack([loss for _, loss, _ in self.pending])
        if self.world > 1:
            dist.all_reduce(losses)
            losses /= self.world
        for (step, _, seconds), value in zip(self.pending, losses.tolist()):
            if not math.isfinite(value):
                raise TrainingDiverged(f"train loss is {value} at step {step}: stopped; {self.kept()}")
            self.history.append({"step": step, "split": "train", "loss": value, "seconds": seconds})
        self.pending = []

    def kept(self) -> str:
        return (f"the last good checkpoint, step {self.last_saved}, is kept at {self.path}"
                if self.last_saved is not None else "no checkpoint was written")

    def run(self) -> TrainResult:
        finished = self.try_resume()
        if finished is not None:
            self.say(f"{self.path} already holds all {self.cfg.steps} steps: nothing to train "
                     "(set train.resume: false to train again)")
            return TrainResult(finished, self.history, self.path)
        cfg, start_step = self.cfg, self.step
        val = open_source("synthetic" if self.source == "synthetic" else "cache", self.cache_dir,
                          "val", self.model_cfg.vocab_size, cfg.seed)
        # steps before the clock starts: compilation and allocator warm-up are not throughput
        warm = min(cfg.timing_warmup, cfg.steps - start_step - 1)
        timing = {"data_wait": 0.0, "excluded": 0.0, "start": time.perf_counter()}
        # None: a bar on a terminal only; a kernel's stderr is no terminal, and a stored notebook
        # would keep every update of it
        bar = tqdm(total=cfg.steps, initial=start_step, desc="train", unit="step",
                   disable=None if self.progress and self.rank == 0 else True)
        batches, started = self.loader(), time.perf_counter()
        # wall-clock seconds of this run, continued from the last row of a resumed history
        self.clock = (started, self.history[-1].get("seconds", 0.0) if self.history else 0.0)
        while self.step < cfg.steps:
            self.train_step(batches, timing)
            if self.step - start_step == warm:
                self.synchronize()
                timing.update(data_wait=0.0, excluded=0.0, start=time.perf_counter(), rates=[])
                timing["mark"] = (self.step, timing["start"], 0.0)
            if self.step % cfg.log_every == 0 or self.step == cfg.steps:
                self.flush()
                self.mark_window(timing)
                bar.set_postfix(loss=f"{self.history[-1]['loss']:.3f}",
                                tok_s=f"{self.tokens_per_s(timing, start_step + warm):,.0f}")
            if self.step % cfg.eval_every == 0 or self.step == cfg.steps:
                self.timed_aside(timing, lambda: self.validate(val))
            if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0 and self.step < cfg.steps:
                self.timed_aside(timing, self.save)
            bar.update(1)
        bar.close()
        self.synchronize()
        metrics = self.metrics(timing, start_step + warm, time.perf_counter() - started)
        self.save(metrics)
        if bar.disable:  # no bar showed it: one line per trained model
            self.say(summary_line(metrics, self.path))
        return TrainResult(metrics, self.history, self.path)

    def validate(self, val) -> None:
        train_seconds = self.train_seconds()
        loss = evaluate(self.step_model, val, self.cfg, self.batch_size, self.sw, self.device,
                        self.rank, self.world)
        self.history.append({"step": self.step, "split": "val", "loss": loss,
                             "seconds": self.elapsed(), "train_seconds": train_seconds,
                             "tokens": self.step * self.tokens_per_step()})

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def timed_aside(self, timing: dict, work) -> None:
        """Run evaluation or checkpointing, its time kept out of the throughput."""
        self.synchronize()
        begin = time.perf_counter()
        work()
        self.synchronize()
        timing["excluded"] += time.perf_counter() - begin
        self.aside += time.perf_counter() - begin

    def elapsed(self) -> float:
        started, offset = self.clock
        return round(offset + time.perf_counter() - started, 3)

    def train_seconds(self) -> float:
        """Wall-clock seconds of training so far, evaluations and checkpoints left out (the
        clock of time to target; compilation and warm-up steps count)."""
        self.synchronize()
        return round(self.elapsed() - self.aside, 3)

    def mark_window(self, timing: dict) -> None:
        """tokens/s of the window since the last mark (evaluation and checkpoints left out): their
        spread is the noise of the run's tokens/s that the report compares changes against."""
        if "mark" not in timing:
            return
        step, begin, excluded = timing["mark"]
        now = time.perf_counter()
        seconds = now - begin - (timing["excluded"] - excluded)
        if self.step > step and seconds > 0:
            timing["rates"].append((self.step - step) * self.tokens_per_step() / seconds)
        timing["mark"] = (self.step, now, timing["excluded"])

    def tokens_per_s(self, timing: dict, timed_from: int) -> float:
        seconds = time.perf_counter() - timing["start"] - timing["excluded"]
        tokens = (self.step - timed_from) * self.tokens_per_step()
        return tokens / seconds if seconds > 0 and tokens > 0 else float("nan")

    def tokens_per_step(self) -> int:
        return self.cfg.seq_len * self.batch_size * self.cfg.grad_accum * self.world

    def final_evaluation(self) -> dict:
        """The validation metrics of the trained model beyond val_loss (see evaluate_metrics):
        latent and plain models get the same prefix metrics, side by side."""
        val = open_source("synthetic" if self.source == "synthetic" else "cache", self.cache_dir,
                          "val", self.model_cfg.vocab_size, self.cfg.seed)
        found = evaluate_metrics(self.step_model, val, self.cfg, self.batch_size, self.sw,
                                 self.device, self.rank, self.world, full=True)
        return {k: v for k, v in found.items() if k != "val_loss"}

    def metrics(self, timing: dict, timed_from: int, seconds: float) -> dict:
        train = [r["loss"] for r in self.history if r["split"] == "train"]
        val = [r["loss"] for r in self.history if r["split"] == "val"]
        tokens_per_s = self.tokens_per_s(timing, timed_from)
        timed = time.perf_counter() - timing["start"] - timing["excluded"]
        flops = self.model.flops_per_token(self.cfg.seq_len)
        peak = peak_flops(self.device, self.sw.amp)
        memory, memory_kind = peak_memory(self.device)
        device_name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        return {
            "data": ("synthetic: uniform random tokens, the loss says nothing about learning"
                     if self.source == "synthetic" else self.source),
            "device": device_name, "world_size": self.world, "mixer": self.model_cfg.mixer,
            "kernel": self.model_cfg.kernel, "n_latent": self.model_cfg.n_latent,
            # kernel auto: what it ran per op and shape class (every choice of this process so far)
            **({"kernel_choices": kernel_choices()} if self.model_cfg.kernel == "auto" else {}),
            # with latents every step also runs latent_steps forward + backward passes of the
            # inner loop, which tokens/s includes and flops_per_token (hence MFU) does not
            "latent_steps": self.cfg.latent.steps if self.model_cfg.n_latent else 0,
            "params": self.model.num_params(non_embedding=False),
            "params_non_embedding": self.model.num_params(),
            "steps": self.step, "batch_size": self.batch_size, "seq_len": self.cfg.seq_len,
            "tokens_per_step": self.tokens_per_step(),
            "train_loss": train[-1], "train_loss_last10": sum(train[-10:]) / len(train[-10:]),
            # the last evaluation's: the NELBO bound per token for a latent model (q fitted by
            # train.latent.steps inner steps, KL included), the NLL per token for a plain one
            "val_loss": val[-1],
            "tokens_per_s": None if math.isnan(tokens_per_s) else round(tokens_per_s, 1),
            # the standard deviation of tokens/s over the logging windows (None under two)
            "tokens_per_s_noise": round(statistics.stdev(timing["rates"]), 1)
            if len(timing.get("rates", [])) >= 2 else None,
            "timed_steps": self.step - timed_from, "flops_per_token": flops,
            "mfu": None if peak is None or math.isnan(tokens_per_s)
            else round(flops * tokens_per_s / (peak * self.world), 4),
            "mfu_peak_flops_per_gpu": peak,
            "peak_memory_mib": round(memory, 1), "peak_memory_kind": memory_kind,
            "data_wait_fraction": round(timing["data_wait"] / timed, 4) if timed > 0 else None,
            "seconds": round(seconds, 2), "switches": dataclasses.asdict(self.sw),
            "optimizer": self.cfg.optimizer, **time_to_target(self.history, self.cfg.target_loss),
            "torch": torch.__version__, **self.stamp,
            # last, so that its time stays out of the timings above
            **self.final_evaluation(),
        }


def summary_line(metrics: dict, path: Path) -> str:
    """One line for a finished run: steps, losses (the validation loss named a bound for a latent
    model), speed and where the checkpoint is."""
    val = "val NLL bound" if metrics.get("n_latent") else "val NLL"
    speed = f", {metrics['tokens_per_s']:,.0f} tokens/s" if metrics.get("tokens_per_s") else ""
    return (f"trained {metrics['steps']} steps in {metrics['seconds']:.0f} s: train loss "
            f"{metrics['train_loss']:.3f}, {val} {metrics['val_loss']:.3f}{speed} -> {path}")


def run_training(model_cfg: ModelConfig, train_cfg: TrainConfig, cache_dir: str, out_dir: str,
                 progress: bool = True, stamp: dict | None = None) -> TrainResult:
    """Train (or resume) one model; checkpoints go to out_dir. Returns metrics and loss history;
    `stamp` goes into the metrics of a run trained now."""
    return Trainer(model_cfg, train_cfg, cache_dir, out_dir, progress, stamp).run()
