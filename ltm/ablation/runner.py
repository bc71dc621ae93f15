"""Measuring one configuration for the ablate stage: a Trainer of ltm.train.trainer started from the
baseline's checkpoint, its step time, the quality score on a fixed validation set, the peak
memory of a step, and a per-operation profile grouped by what the time is spent on.

Every measurement starts from the same state (weights, optimiser, scheduler, data position,
random numbers), so a configuration's quality score is the same number every time it is measured
on the CPU, and two configurations differ only by what their switches change.
"""
from __future__ import annotations

import collections
import contextlib
import copy
import os
import sys
import time
from typing import Callable, Iterator

import torch
from torch import nn
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from ltm.data.batches import open_source
from ltm.train.optimizers import MuonAdamW, optimizer_parts
from ltm.model.lm import LTM, ModelConfig
from ltm.train.checkpoint import seed_everything
from ltm.train.settings import TrainConfig
from ltm.ablation.latent_score import prior_nll_sums
from ltm.train.hardware import autocast
from ltm.train.trainer import Trainer, evaluate

# the groups of the profile, in the order the figure stacks them
GROUPS = ("embeddings", "projections", "convolution", "token mixer kernel", "cross-attention",
          "MLP", "norms", "loss", "optimiser", "data wait", "compiled graph", "other")
RANGE = "ltm::"  # prefix of the profiler ranges that the module hooks open
BACKWARD = "autograd::engine::evaluate_function: "

@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """File descriptor 2 to /dev/null: the profiler's C++ side prints a `USDT ... profiler_start`
    and `profiler_stop` line at every start and stop whatever its log level (torch 2.13)."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def quiet_profile(**options) -> Iterator[profile]:
    """torch.profiler.profile(**options), started and stopped without its native log lines (only
    the start and the stop are silenced: anything the profiled code prints still shows)."""
    prof = profile(**options)
    with _native_stderr_silenced():
        prof.start()
    try:
        yield prof
    finally:
        with _native_stderr_silenced():
            prof.stop()


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


def allocation_peak(prof: profile) -> int | None:
    """The peak of live CPU tensor bytes during the profiled code, above the bytes live when it
    started: the running sum of the profiler's allocation (+) and free (-) records."""
    try:
        records = [(e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                   if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    except AttributeError:  # a torch without these records
        return None
    live = peak = 0
    for _, nbytes in sorted(records):
        live += nbytes
        peak = max(peak, live)
    return peak


# --- the per-operation profile --------------------------------------------------------------

def module_groups(loss_model: nn.Module) -> dict[nn.Module, str]:
    """The group each module's own operations count to. The innermost labelled module wins: a
    projection inside the mixer is a projection, the mixer's remaining work its kernel. The MLP
    and the latent cross-attention are one group each, their linears included."""
    groups: dict[nn.Module, str] = {loss_model: "loss"}
    model = getattr(loss_model, "model", loss_model)
    groups[model] = "loss"  # LTM.forward's own ops: the plain cross-entropy
    inside_whole: set[int] = set()
    for name, module in model.named_modules():
        if id(module) in inside_whole or module is model:
            continue
        leaf = name.rsplit(".", 1)[-1]
        kind = type(module).__name__.lower()
        group = ("MLP" if leaf == "mlp" else "cross-attention" if leaf == "cross"
                 else "token mixer kernel" if leaf == "mixer"
                 else "loss" if leaf == "lm_head"
                 else "embeddings" if isinstance(module, nn.Embedding)
                 else "projections" if isinstance(module, nn.Linear)
                 else "convolution" if "conv" in kind
                 else "norms" if "norm" in kind else "other")
        groups[module] = group
        if group in ("MLP", "cross-attention"):
            inside_whole.update(id(m) for m in module.modules())
    return groups


class ModuleRanges:
    """A profiler range `ltm::<group>` around each labelled module's forward, opened and closed
    by forward hooks registered here, so the model's files stay free of profiling code."""

    def __init__(self, loss_model: nn.Module) -> None:
        self.handles, self.open = [], []
        for module, group in module_groups(loss_model).items():
            self.handles.append(module.register_forward_pre_hook(self._enter(group)))
            self.handles.append(module.register_forward_hook(self._exit))

    def _enter(self, group: str):
        def hook(module, args):
            self.open.append(record_function(RANGE + group))
            self.open[-1].__enter__()
        return hook

    def _exit(self, module, args, output):
        if self.open:
            self.open.pop().__exit__(None, None, None)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        while self.open:
            self.open.pop().__exit__(None, None, None)


class WaitRange:
    """The batch iterator, each `next` inside an `ltm::data wait` range."""

    def __init__(self, batches) -> None:
        self.batches = batches

    def __next__(self):
        with record_function(RANGE + "data wait"):
            return next(self.batches)


def group_of(event, seq_groups: dict[int, str]) -> str:
    """The group of one profiler event: its innermost labelled range, the optimiser's range,
    or, in the backward pass, the group of the forward operation that made the autograd node
    (the same sequence number)."""
    node = event
    while node is not None:
        name = node.name
        if name.startswith(RANGE):
            return name[len(RANGE):]
        if name.startswith("Optimizer."):
            return "optimiser"
        if name.startswith(BACKWARD):
            return seq_groups.get(node.sequence_nr, "other")
        if "Compiled" in name:
            return "compiled graph"
        node = node.cpu_parent
    return "other"


def group_times(events, device: bool) -> dict[str, float]:
    """Self time in microseconds per group, every event counted once: device (kernel) time on a
    GPU, CPU time on the CPU."""
    seq_groups: dict[int, str] = {}
    for event in events:  # in start order: a node's forward op comes before its backward
        if event.sequence_nr >= 0:
            seq_groups.setdefault(event.sequence_nr, group_of(event, {}))
    totals: dict[str, float] = collections.defaultdict(float)
    for event in events:
        if getattr(event, "device_type", DeviceType.CPU) != DeviceType.CPU:
            continue  # a kernel: its time is already its launching operation's device time
        spent = (getattr(event, "self_device_time_total", 0.0) if device
                 else event.self_cpu_time_total)
        totals[group_of(event, seq_groups)] += spent
    return dict(totals)


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
