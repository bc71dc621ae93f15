"""Measuring one configuration for the ablate stage: a Trainer of ltm.train.trainer started from the
baseline's checkpoint, its step time, the quality score on a fixed validation set and the peak
memory of a step (its per-operation profile: ltm.ablation.profiling).

Every measurement starts from the same state (weights, optimiser, scheduler, data position,
random numbers), so a configuration's quality score is the same number every time it is measured
on the CPU, and two configurations differ only by what their switches change.
"""
from __future__ import annotations

import copy
import time
from typing import Callable, Iterator

import torch
from torch import nn
from torch.profiler import ProfilerActivity

from ltm.data.batches import open_source
from ltm.train.optimizers import MuonAdamW, optimizer_parts
from ltm.model.lm import LTM, ModelConfig
from ltm.train.checkpoint import seed_everything
from ltm.train.settings import TrainConfig
from ltm.ablation.latent_score import prior_nll_sums
from ltm.ablation.profiling import (GROUPS, RANGE, ModuleRanges, WaitRange, allocation_peak,
                                    group_times, quiet_profile)
from ltm.train.hardware import autocast
from ltm.train.trainer import Trainer, evaluate

# a step timer: (runner, the step to run) -> seconds; tests pass a fake one
StepTimer = Callable[["Runner", Callable[[], None]], float]


class FixedVal:
    """The validation windows every measurement is scored on: the first `rows` windows of
    seq_len tokens of the validation split, whatever the batch size (evaluate asks for batches
    of batch_size * grad_accum rows and gets them cut from this one fixed set)."""

    def __init__(self, source, rows: int, seq_len: int) -> None:
        self.x, self.y = next(iter(source.eval_batches(rows, seq_len, 1)))

    def eval_batches(self, batch_size: int, seq_len: int, max_batches: int) -> Iterator:
        # max_batches is ignored: the score is over the whole fixed set
        for start in range(0, len(self.x), batch_size):
            yield self.x[start:start + batch_size], self.y[start:start + batch_size]


def real_step_timer(runner: "Runner", step: Callable[[], None]) -> float:
    """Wall seconds of one step, the device's queue drained before and after."""
    runner.trainer.synchronize()
    begin = time.perf_counter()
    step()
    runner.trainer.synchronize()
    return time.perf_counter() - begin


class Runner:
    """One configuration: a Trainer (never run through Trainer.run, so it writes no checkpoint)
    reset to the baseline's checkpoint before each measurement."""

    def __init__(self, model_cfg: ModelConfig, train_cfg: TrainConfig, cache_dir: str,
                 state: dict, val_rows: int, tmp_dir: str) -> None:
        """train_cfg.steps: where the data loader and the lr schedule of a measurement end."""
        self.trainer = Trainer(model_cfg, train_cfg, cache_dir, tmp_dir, progress=False)
        t = self.trainer
        self.state, self.start = state, state["step"]
        source = open_source("synthetic" if t.source == "synthetic" else "cache", cache_dir, "val",
                             t.model_cfg.vocab_size, train_cfg.seed)
        self.val = FixedVal(source, val_rows, train_cfg.seq_len)
        self.batches = None
        self.loaded = load_weights(t.model, state["model"])

    def reset(self) -> None:
        """Back to the checkpoint: weights, optimiser moments, lr schedule, data position, RNG."""
        t = self.trainer
        self.close_loader()
        load_weights(t.model, self.state["model"])
        for part in optimizer_parts(t.optimizer):
            part.state.clear()
        # another optimiser than the checkpoint's (train.optimizer): fresh moments, the schedule's
        # position only
        saved_muon = set(self.state["optimizer"]["state"]) == {"muon", "adamw"}
        same = isinstance(t.optimizer, MuonAdamW) == saved_muon
        if self.loaded == "all" and same:
            restore_optimizer(t.optimizer, self.state["optimizer"])
        restore_schedule(t.scheduler, self.state["scheduler"], same)
        if t.scaler.is_enabled() and self.state.get("scaler"):
            t.scaler.load_state_dict(self.state["scaler"])
        t.step, t.history, t.pending = self.start, [], []
        seed_everything(t.cfg.seed)
        self.batches = t.loader()

    def close_loader(self) -> None:
        # ends the loader's worker processes, if any
        self.batches = None

    def step(self) -> None:
        self.use_precision()
        # a latent model's inner loop draws its noise from the global generator, and the runners'
        # blocks alternate: seeded by the step index, step k draws the same noise in every runner
        # (else an exact switch of a latent model moves the score and FAILs)
        torch.manual_seed(self.trainer.cfg.seed * 1_000_003 + self.trainer.step)
        self.trainer.train_step(self.batches, {"data_wait": 0.0})

    def use_precision(self) -> None:
        # process-wide, and set by the last Trainer built: the runners' blocks alternate, so
        # each step sets its own (the tf32 switch)
        torch.set_float32_matmul_precision("high" if self.trainer.sw.tf32 else "highest")

    def timed_steps(self, n: int, timer: StepTimer) -> list[float]:
        return [timer(self, self.step) for _ in range(n)]

    def memory_step(self) -> tuple[float | None, str]:
        """One step with its peak memory in bytes: the resident state (weights, optimiser
        moments) plus the step's allocation peak above what was live when it started."""
        t = self.trainer
        resident = state_bytes(t.model, t.optimizer)
        if t.device.type == "cuda":
            t.synchronize()
            live = torch.cuda.memory_allocated(t.device)
            torch.cuda.reset_peak_memory_stats(t.device)
            self.step()
            t.synchronize()
            peak = torch.cuda.max_memory_allocated(t.device) - live
            return resident + peak, "weights + optimiser state + step peak (CUDA allocator)"
        with quiet_profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            self.step()
        peak = allocation_peak(prof)
        if peak is None:
            return None, "not measured"
        return resident + peak, "weights + optimiser state + step peak (torch.profiler)"

    def finish(self) -> float:
        """Stop on a NaN loss (TrainingDiverged), then the quality score over the fixed validation
        set: a plain model's NLL per token; a latent model's NLL per token given z drawn from the
        prior with fixed seeds (latent_score), not its fitted bound."""
        t = self.trainer
        t.flush()
        self.close_loader()
        self.use_precision()
        # the eager model: the weights carry everything the compiled steps did, and a compiled
        # model would compile a second, inference graph for every candidate (a minute on a GPU)
        if t.model_cfg.n_latent > 0 and t.cfg.latent.steps > 0:
            return self.latent_score()
        return evaluate(t.loss_model, self.val, t.cfg, t.batch_size, t.sw, t.device, t.rank, t.world)

    def latent_score(self) -> float:
        """E_prior[NLL] per token of a latent model over the fixed set, each batch's z from a
        generator seeded by train.seed and the batch index (ltm.ablation.latent_score):
        every runner draws the same z, and no inner loop amplifies a rounding difference of the
        weights into a different fitted z (the fitted bound moved by 0.4-0.6 nats under exact
        switches; issue 41)."""
        t = self.trainer
        model = t.model
        model.eval()
        sums = torch.zeros(2, dtype=torch.float64, device=t.device)
        with autocast(t.device, t.sw.amp):
            for i, (x, y) in enumerate(self.val.eval_batches(t.batch_size, t.cfg.seq_len, 0)):
                sums += prior_nll_sums(model, x.to(t.device), y.to(t.device), t.cfg.seed + i)
        model.train()
        return float(sums[0] / sums[1])

    def tokens_per_step(self) -> int:
        return self.trainer.tokens_per_step()


def restore_optimizer(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """Load a checkpoint's optimiser state (of the same kind) into `optimizer`, keeping this
    configuration's flags (fused, foreach, ...) and taking the checkpoint's lr."""
    if isinstance(optimizer, MuonAdamW):
        for name, part in optimizer.parts.items():
            restore_optimizer(part, {"state": saved["state"][name],
                                     "param_groups": saved["param_groups"][name]})
        return
    # a copy: load_state_dict keeps the given moment tensors and the steps update them in place,
    # which would move the checkpoint itself
    optimizer.load_state_dict({**copy.deepcopy(saved), "param_groups": [
        {**saved_group, **{k: v for k, v in group.items() if k != "params"},
         "lr": saved_group["lr"], "initial_lr": saved_group.get("initial_lr", group["lr"])}
        for saved_group, group in zip(saved["param_groups"], optimizer.param_groups)]})


def restore_schedule(scheduler, saved: dict, same_optimizer: bool) -> None:
    """The checkpoint's lr schedule; for another optimiser (other groups, other peak lrs) only
    its position, each group's lr set from its own peak."""
    if same_optimizer:
        scheduler.load_state_dict(saved)
        return
    scheduler.last_epoch = saved["last_epoch"]
    for group, base, factor in zip(scheduler.optimizer.param_groups, scheduler.base_lrs,
                                   scheduler.lr_lambdas):
        group["lr"] = base * factor(scheduler.last_epoch)


def load_weights(model: nn.Module, saved: dict) -> str:
    """Load the tensors of `saved` that fit `model` (same name and shape); 'all' when every
    tensor of both matched, else 'k of n' (another architecture: the rest keep their init)."""
    own = model.state_dict()
    fitting = {k: v for k, v in saved.items() if k in own and own[k].shape == v.shape}
    model.load_state_dict(fitting, strict=False)
    if len(fitting) == len(own) == len(saved):
        return "all"
    return f"{len(fitting)} of {len(own)} tensors"


def fits(model_cfg: ModelConfig, saved: dict) -> bool:
    """Whether a checkpoint's weights are exactly those of a model of model_cfg."""
    own = LTM(model_cfg).state_dict()
    return own.keys() == saved.keys() and all(own[k].shape == saved[k].shape for k in own)


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    tensors = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    for state in (s for part in optimizer_parts(optimizer) for s in part.state.values()):
        for value in state.values():
            if torch.is_tensor(value):
                tensors[value.data_ptr()] = value.numel() * value.element_size()
    return sum(tensors.values())


def profile_runner(runner: Runner, warmup: int, steps: int) -> tuple[dict[str, float], float]:
    """Milliseconds per step in each group over `steps` profiled steps after `warmup` others,
    from the checkpoint, and the profiled steps' wall milliseconds per step (what the groups
    should add up to, profiler overhead included). On a GPU the groups hold kernel time, and
    data wait the host's wait. A compiled model is one fused graph: not split by module."""
    t = runner.trainer
    runner.reset()
    for _ in range(warmup):
        runner.step()
    ranges = None if t.sw.compile else ModuleRanges(t.loss_model)
    runner.batches = WaitRange(runner.batches)
    cuda = t.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    try:
        t.synchronize()
        with quiet_profile(activities=activities) as prof:
            begin = time.perf_counter()
            for _ in range(steps):
                runner.step()
            t.synchronize()
            wall = time.perf_counter() - begin
    finally:
        if ranges is not None:
            ranges.remove()
        runner.close_loader()
    events = prof.events()
    totals = group_times(events, device=cuda)
    if cuda:  # the wait for data is host time, no kernel runs in it
        totals["data wait"] = sum(e.cpu_time_total for e in events
                                  if e.name == RANGE + "data wait")
    t.flush()
    return {group: totals.get(group, 0.0) / 1e3 / steps for group in GROUPS}, 1e3 * wall / steps
