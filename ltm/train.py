"""The train stage: AdamW with warm-up and cosine decay, gradient accumulation and clipping,
evaluation on the validation split, atomic resumable checkpoints, one process or many (DDP).

Every speed optimisation is a switch under `train.opt` (see OptConfig); `auto` picks per device.
The data position is a micro-batch index (see ltm.batches), checkpoints are in ltm.checkpoint.

    python -m ltm.train [--params params.yaml] [--set model.mixer=deltanet ...]
    torchrun --nproc_per_node=N -m ltm.train [--params ...]
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from ltm import checkpoint as ckpt
from ltm.batches import MicroBatches, check_data, check_lengths, open_source, with_vocab
from ltm.cache import cache_dir_of
from ltm.corpus import DataError
from ltm.counterpart import CounterpartConfig, train_with_counterparts
from ltm.hardware import (allow_recompiles, autocast, find_batch_size, peak_flops, peak_memory,
                          setup_distributed)
from ltm.latent import LatentConfig, validation_metrics
from ltm.levers import FUSED_OPS, convert_fp8, make_muon, resolve_data, time_to_target
from ltm.losses import LossModel
from ltm.model import LTM, ModelConfig
from ltm.params import ParamsError, apply_override, check, from_mapping, read_params, to_dict
from ltm.pipeline import stage_paths

Auto = Literal["auto"]


@dataclass
class OptConfig:
    """`train.opt`: speed switches, each independent. auto = on for CUDA, off for the CPU, except
    fused_loss: auto = off everywhere (on an H200 the compiled plain loss was 11% faster)."""

    amp: Literal["auto", "off", "bf16", "fp16"] = "auto"  # mixed precision; fp16 adds a grad scaler
    tf32: bool | Auto = "auto"  # TF32 tensor cores for float32 matmuls (CUDA only)
    compile: bool | Auto = "auto"  # torch.compile the model and loss (and Muon's step)
    fused_adamw: bool | Auto = "auto"  # one fused kernel for the whole AdamW update
    workers: int = 0  # processes preparing batches ahead (0 = in the training loop)
    pin_memory: bool | Auto = "auto"  # page-locked batches, copied with non_blocking (CUDA only)
    pretokenized: bool = True  # false = tokenise raw text for every batch (the baseline)
    fused_loss: bool | Auto = "auto"  # chunked cross-entropy, no full-vocabulary logits
    # torch.compile's mode: default | reduce-overhead (CUDA graphs of the forward and backward)
    # | max-autotune | max-autotune-no-cudagraphs; with compile on only
    compile_mode: Literal["default", "reduce-overhead", "max-autotune",
                          "max-autotune-no-cudagraphs"] = "default"
    fp8: bool = False  # torchao float8 training of the block linears (CUDA, SM 8.9+)
    # fused kernels (ltm.fused): some of rms_norm, swiglu, rope, cross_entropy
    fused_ops: list[str] = field(default_factory=list)

    def __post_init__(self):
        check(self.workers >= 0, "workers", f"must be >= 0, got {self.workers}")
        unknown = [op for op in self.fused_ops if op not in FUSED_OPS]
        check(not unknown, "fused_ops", f"unknown {unknown}; expected some of {list(FUSED_OPS)}")


@dataclass
class TrainConfig:
    """`train:` section of params.yaml. Defaults: a short run of the tiny model on a CPU."""

    seed: int = 1337
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # cache = the token cache of the tokenize stage; synthetic = uniform random tokens (throughput);
    # auto = the cache in data.cache_dir when there is one, else synthetic (the GPU profile)
    data: Literal["cache", "synthetic", "auto"] = "cache"
    steps: int = 200  # optimiser steps
    batch_size: int | Auto = 16  # sequences per process per micro-step; auto = largest that fits
    seq_len: int = 128
    grad_accum: int = 1  # micro-steps per optimiser step
    lr: float = 3e-3  # peak learning rate, reached after warmup_steps
    min_lr: float = 3e-4  # end of the cosine decay
    warmup_steps: int = 20
    weight_decay: float = 0.1  # on matrices only, not on norms
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # max global gradient norm; 0 = no clipping
    eval_every: int = 50  # steps between validation losses (and at the end)
    eval_batches: int = 8  # validation batches per evaluation
    checkpoint_every: int = 100  # steps between checkpoints (and at the end); 0 = end only
    resume: bool = True  # continue from the checkpoint in out_dir if it matches this config
    log_every: int = 10  # steps between progress updates (each one waits for the device)
    timing_warmup: int = 5  # first steps left out of tokens/s (compilation, allocator warm-up)
    memory_fraction: float = 0.85  # batch_size auto: share of GPU memory a step may use
    # adamw; or muon: torch.optim.Muon on the blocks' 2-D weights, AdamW (lr, betas,
    # weight_decay above) on the embedding / head and the norms (ltm.levers); same lr schedule
    optimizer: Literal["adamw", "muon"] = "adamw"
    muon_lr: float = 0.02  # Muon's peak lr (its schedule: lr's, scaled by muon_lr / lr)
    muon_momentum: float = 0.95
    muon_weight_decay: float = 0.0
    # original: lr * sqrt(max(1, rows / cols)) (Keller Jordan's); match_rms_adamw: Moonshot's
    # 0.2 * sqrt(max(rows, cols)), which lets muon_lr be an AdamW-sized lr
    muon_adjust_lr: Literal["original", "match_rms_adamw"] = "original"
    # time to target: the first evaluation whose val_loss <= target_loss is recorded (train.json:
    # seconds, tokens, step); null = off
    target_loss: float | None = None
    # latent thoughts (model.n_latent > 0): each batch's posterior and its inner loop
    latent: LatentConfig = field(default_factory=LatentConfig)
    # the train stage's other models beside this one: latent vs plain (ltm.counterpart)
    counterpart: CounterpartConfig = field(default_factory=CounterpartConfig)
    opt: OptConfig = field(default_factory=OptConfig)

    def __post_init__(self):
        for name in ("steps", "seq_len", "grad_accum", "eval_every", "eval_batches", "log_every"):
            check(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "checkpoint_every", "timing_warmup"):
            check(getattr(self, name) >= 0, name, f"must be >= 0, got {getattr(self, name)}")
        check(self.batch_size == "auto" or self.batch_size >= 1, "batch_size",
              f"must be >= 1 or auto, got {self.batch_size}")
        check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
        check(0 <= self.min_lr <= self.lr, "min_lr", f"must be in [0, lr={self.lr}], got {self.min_lr}")
        check(self.grad_clip >= 0, "grad_clip", f"must be >= 0, got {self.grad_clip}")
        check(0 < self.memory_fraction <= 1, "memory_fraction",
              f"must be in (0, 1], got {self.memory_fraction}")
        check(self.muon_lr > 0, "muon_lr", f"must be > 0, got {self.muon_lr}")
        check(0 <= self.muon_momentum < 1, "muon_momentum",
              f"must be in [0, 1), got {self.muon_momentum}")
        check(self.muon_weight_decay >= 0, "muon_weight_decay",
              f"must be >= 0, got {self.muon_weight_decay}")


@dataclass
class Switches:
    """OptConfig with every auto decided for the device."""

    amp: Literal["off", "bf16", "fp16"]
    tf32: bool
    compile: bool
    fused_adamw: bool
    workers: int
    pin_memory: bool
    pretokenized: bool
    fused_loss: bool
    compile_mode: str = "default"
    fp8: bool = False
    fused_ops: tuple[str, ...] = ()


def resolve_switches(opt: OptConfig, device: torch.device) -> Switches:
    cuda = device.type == "cuda"
    decide = {name: cuda if getattr(opt, name) == "auto" else getattr(opt, name)
              for name in ("tf32", "compile", "fused_adamw", "pin_memory")}
    # measured on an H200 (GPT-2 small, T=1024, compiled): the chunked loss saved 0.8 GB of 9.5
    # but cost 11% of tokens/s, so it is for when memory, not speed, is short
    decide["fused_loss"] = False if opt.fused_loss == "auto" else opt.fused_loss
    amp = ("bf16" if cuda else "off") if opt.amp == "auto" else opt.amp
    # page-locked memory only speeds up copies to a GPU; TF32 is a GPU number format
    decide["pin_memory"] = decide["pin_memory"] and cuda
    decide["tf32"] = decide["tf32"] and cuda
    return Switches(amp=amp, workers=opt.workers, pretokenized=opt.pretokenized,
                    compile_mode=opt.compile_mode, fp8=opt.fp8, fused_ops=tuple(opt.fused_ops),
                    **decide)


@dataclass
class TrainResult:
    metrics: dict  # what train.json holds
    history: list[dict]  # rows (step, split, loss) of the loss curves
    checkpoint: Path | None  # the last checkpoint written
    # the train stage with counterparts: every model's rows (model, step, split, loss, seconds)
    compared: list[dict] = field(default_factory=list)


class TrainingDiverged(RuntimeError):
    """The loss, the weights or the optimiser state became NaN or infinite; the run stopped, its
    last checkpoint with finite weights and optimiser state kept."""


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to lr, then cosine decay to min_lr at the last step; a factor of lr."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return (cfg.min_lr + cosine * (cfg.lr - cfg.min_lr)) / cfg.lr


def make_optimizer(model: nn.Module, cfg: TrainConfig, fused: bool, compiled: bool = False):
    """AdamW (fused: its fused CUDA kernel) or Muon + AdamW (compiled: Muon's step compiled), with
    the lr schedule."""
    if cfg.optimizer == "muon":
        optimizer = make_muon(model, cfg, fused, compiled)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))
        return optimizer, scheduler
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))
    return optimizer, scheduler


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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
    """ltm.latent.validation_metrics of the validation pieces (see _val_pieces), token-weighted
    over all processes: the result does not depend on how the global batch is split (up to the
    latents' noise). A latent model (loss_model.uses_latents) is scored by the negative ELBO with
    q fitted by train.latent.steps inner steps; val_loss is that bound, never the NLL given the
    fitted z alone; a plain model's val_loss is its NLL. full: also the bound by inference steps
    (train.latent.eval_steps) and the second half's NLL given the first half."""
    inner = _unwrap(loss_model)
    inner.eval()
    with autocast(device, sw.amp):
        metrics = validation_metrics(
            inner.model, inner.fitter if inner.uses_latents else None,
            _val_pieces(val, cfg, batch_size, device, rank, world), full=full,
            eval_steps=cfg.latent.eval_steps, samples=cfg.latent.eval_samples, seed=cfg.seed,
            reduce=dist.all_reduce if world > 1 else None, eval_batches=cfg.latent.eval_batches)
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
                 progress: bool) -> None:
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
            from ltm.fused import apply_fused_ops  # imports Triton: only when asked
            apply_fused_ops(self.model, self.sw.fused_ops)
        if self.sw.fp8:
            convert_fp8(self.model, self.device)
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
        bar = tqdm(total=cfg.steps, initial=start_step, desc="train", unit="step",
                   disable=not self.progress or self.rank != 0)
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
            "torch": torch.__version__,
            # last, so that its time stays out of the timings above
            **self.final_evaluation(),
        }


def run_training(model_cfg: ModelConfig, train_cfg: TrainConfig, cache_dir: str, out_dir: str,
                 progress: bool = True) -> TrainResult:
    """Train (or resume) one model; checkpoints go to out_dir. Returns metrics and loss history."""
    return Trainer(model_cfg, train_cfg, cache_dir, out_dir, progress).run()


def write_outputs(result: TrainResult, metrics_path: str | Path, plot_path: str | Path) -> None:
    """train.json for `dvc metrics`; the loss curves for `dvc plots`: the train rows in plot_path,
    the validation rows beside it (val_loss.csv), so each is its own series, never one line that
    jumps between them."""
    plot_path = Path(plot_path)
    for path in (Path(metrics_path), plot_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    Path(metrics_path).write_text(json.dumps(result.metrics, indent=1) + "\n")
    train = ["step,seconds,loss"] + [f"{r['step']},{r.get('seconds', '')},{r['loss']!r}"
                                     for r in result.history if r["split"] == "train"]
    plot_path.write_text("\n".join(train) + "\n")
    # the validation curve also against training seconds (evaluations left out) and tokens: the
    # axes of time to target
    val = ["step,seconds,loss,train_seconds,tokens"] + [
        f"{r['step']},{r.get('seconds', '')},{r['loss']!r},{r.get('train_seconds', '')},"
        f"{r.get('tokens', '')}" for r in result.history if r["split"] == "val"]
    val_curve_path(plot_path).write_text("\n".join(val) + "\n")
    # always written (a header alone without counterparts): an output of the stage
    rows = ["model,split,step,seconds,loss"] + [
        f"{r['model']},{r['split']},{r['step']},{r.get('seconds', '')},{r['loss']!r}"
        for r in result.compared]
    compare_curve_path(plot_path).write_text("\n".join(rows) + "\n")


def val_curve_path(plot_path: str | Path) -> Path:
    """Where write_outputs puts the validation curve: val_loss.csv beside the train curve."""
    return Path(plot_path).with_name("val_loss.csv")


def compare_curve_path(plot_path: str | Path) -> Path:
    """Where write_outputs puts every model's curves (train stage with counterparts):
    compare_loss.csv beside the train curve, rows (model, split, step, seconds, loss)."""
    return Path(plot_path).with_name("compare_loss.csv")


def load_configs(params_path: str | Path,
                 overrides: list[str] = ()) -> tuple[ModelConfig, TrainConfig, str]:
    """The model and train sections and data.cache_dir, with `section.key=value` overrides
    (values read as YAML) applied first."""
    params = read_params(params_path)
    for item in overrides:
        apply_override(params, item, "--set")
    model_cfg = from_mapping(ModelConfig, params.get("model"), "model")
    train_cfg = from_mapping(TrainConfig, params.get("train"), "train")
    return model_cfg, train_cfg, cache_dir_of(params)


def train_stage(params_path: str | Path, checkpoint_dir: str | Path, metrics_path: str | Path,
                plot_path: str | Path, overrides: list[str] = (),
                progress: bool = True) -> TrainResult:
    """The train stage: train from params.yaml's model and train sections, then (train.counterpart)
    the plain or latent model beside it and a plain model at equal FLOPs (ltm.counterpart); write
    the metrics and loss curves (from the process of rank 0). Paths come from dvc.yaml."""
    model_cfg, train_cfg, cache_dir = load_configs(params_path, overrides)
    say = print if int(os.environ.get("RANK", "0")) == 0 else (lambda *args: None)
    result = train_with_counterparts(model_cfg, train_cfg, cache_dir, checkpoint_dir, progress, say)
    if int(os.environ.get("RANK", "0")) == 0:
        write_outputs(result, metrics_path, plot_path)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description="Train an LTM from a params file.")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one parameter, e.g. --set model.mixer=deltanet")
    # default (None): the train stage's paths in dvc.yaml
    parser.add_argument("--out-dir", help="checkpoint folder")
    parser.add_argument("--metrics", help="metrics JSON")
    parser.add_argument("--plot", help="loss-curve CSV")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    args = parser.parse_args()
    try:
        paths = stage_paths("train", checkpoint_dir=args.out_dir, metrics_path=args.metrics,
                            plot_path=args.plot)
        train_stage(args.params, **paths, overrides=args.set, progress=not args.no_progress)
    except Exception as err:  # one line for the user: the traceback is behind --debug
        if args.debug:
            raise
        raise SystemExit(f"error: {one_line(err)}") from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def one_line(err: Exception) -> str:
    """A user error's message; anything else (a bug) with its type and a pointer to --debug."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    if isinstance(err, (ParamsError, DataError, TrainingDiverged)):
        return " ".join(lines)
    return f"{type(err).__name__}: {lines[0] if lines else ''} (run with --debug for the traceback)"


if __name__ == "__main__":
    main()
