"""The pieces of the ablate stage's profiles (ltm.ablation.runner runs them): torch.profiler started
and stopped without its native log lines, a step's peak of live tensor bytes, and each operation's
time counted to a group (embeddings, projections, the token mixer's kernel, ...)."""
from __future__ import annotations

import collections
import contextlib
import os
import sys
from typing import Iterator

import torch
from torch import nn
from torch.autograd import DeviceType
from torch.profiler import profile, record_function

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
