"""The public references the kernel grid times ours against, as users install them.

fla 0.6.0 is more than its Triton kernels: on Hopper and Blackwell it hands the gated delta rule
(K = V = 128, bf16/fp16) to FlashQLA whenever the `flash-qla` package is installed, and several
shared gated and DPLR (RWKV-7) kernels to TileLang whenever `tilelang` is. fla reads its switches
(`FLA_FLASH_QLA`, `FLA_TILELANG`) from the environment at every call, so one process can time
both: each op's fla entry as installed, and the same entry on fla's own Triton path (both
switches "0"). The plain delta rule is also timed through fla's gated entry with g = 0, the one
way it reaches FlashQLA. Which backends a call ran is read from fla's dispatch log (one INFO line
per operation, function and backend), never assumed.

fla is optional (the GPU machine's extra, absent on the CPU): it is imported in `entry`, when a
grid row asks for a reference, and a reference that cannot be imported is reported as absent.
"""
from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from typing import Callable, Iterator, NamedTuple

import torch

from ltm.ops.auto import FLA_BACKENDS

# fla's environment switches of its optional backends; "0" turns one off
BACKEND_SWITCHES = tuple(FLA_BACKENDS.values())
TRITON_PATH = {name: "0" for name in BACKEND_SWITCHES}


class Reference(NamedTuple):
    """One way to compute an op with fla: `name` in the grid's rows, fla's entry (`entry`'s
    name for it) and the environment switches set while it runs ({}: as installed)."""
    name: str
    entry: str
    switches: dict


# per op, the fla paths that compute it: fla_triton (its Triton kernels alone), fla_installed (as
# installed: the backends present take what they accept), fla_gated_g0 (the plain delta rule through
# the gated entry); the first is the one the gradients' errors are measured against
REFERENCES: dict[str, tuple[Reference, ...]] = {
    "delta_rule": (Reference("fla_triton", "delta_rule", TRITON_PATH),
                   Reference("fla_installed", "delta_rule", {}),
                   Reference("fla_gated_g0", "gated_delta_rule_g0", {})),
    "gated_delta_rule": (Reference("fla_triton", "gated_delta_rule", TRITON_PATH),
                         Reference("fla_installed", "gated_delta_rule", {})),
    "rwkv7": (Reference("fla_triton", "rwkv7", TRITON_PATH),
              Reference("fla_installed", "rwkv7", {})),
}


def entry(name: str) -> Callable[[dict], torch.Tensor] | None:
    """fla's chunked op `name` on `ltm.bench.kernels.make_inputs`' dict, returning o; None when
    fla (or the op in it) cannot be imported. "gated_delta_rule_g0": the gated entry with a zero
    log decay, i.e. the plain delta rule (the zeros are made per call, as a user's would be)."""
    try:
        if name == "rwkv7":
            from fla.ops.rwkv7 import chunk_rwkv7
            return lambda x: chunk_rwkv7(x["r"], x["w"], x["k"], x["v"], x["a"], x["b"])[0]
        if name in ("gated_delta_rule", "gated_delta_rule_g0"):
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule
            if name == "gated_delta_rule":
                return lambda x: chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"])[0]
            return lambda x: chunk_gated_delta_rule(
                x["q"], x["k"], x["v"], torch.zeros(x["beta"].shape, device=x["beta"].device),
                x["beta"])[0]
        if name == "delta_rule":
            from fla.ops.delta_rule import chunk_delta_rule
            return lambda x: chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"])[0]
    except ImportError:
        return None
    raise ValueError(f"unknown fla entry {name!r}")


@contextlib.contextmanager
def switched(switches: dict) -> Iterator[None]:
    """fla's backend switches set to `switches` inside the block ({}: the caller's environment,
    i.e. fla as installed), restored after it."""
    before = {name: os.environ.get(name) for name in switches}
    os.environ.update(switches)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class DispatchLog(logging.Handler):
    """Collects fla's "[FLA Backend] ..." lines: the dispatches that ran ("op.function ->
    backend") in `ran`; in `rejected` the refusals with fla's reason and fla's notes on a backend
    it cannot use (why fla as installed ran its Triton kernels at a shape)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.ran: set[str] = set()
        self.rejected: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if not message.startswith("[FLA Backend]"):
            return
        line = message.removeprefix("[FLA Backend]").strip()
        # a refusal, or a note such as "TileLang is installed but no usable nvcc ... was found"
        (self.ran if " -> " in line and " rejected" not in line else self.rejected).add(line)


def _forget_dispatches() -> None:
    """fla logs each (operation, function, backend) once per process; forgetting what it has
    logged makes the next call's dispatches show again. fla's registries are private: a version
    without them leaves nothing to forget (and `backends` then reads only first calls)."""
    try:
        from fla import backends
    except ImportError:
        return
    for registries in (getattr(backends, "_operation_registries", {}),
                       getattr(backends, "_function_registries", {})):
        for registry in registries.values():
            getattr(registry, "_logged", set()).clear()


@contextlib.contextmanager
def dispatches() -> Iterator[DispatchLog]:
    """The backends fla dispatches to inside the block, in the yielded handler's `ran`."""
    _forget_dispatches()
    # fla's own logger: its dispatcher logs under fla.backends, its checks (a missing nvcc
    # disables TileLang) under fla.utils
    logger = logging.getLogger("fla")
    handler, level = DispatchLog(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def backend_label(ran: set[str]) -> str:
    """The backends a call ran as one short label: "triton" when fla dispatched nothing away from
    its Triton kernels, else the backends by name ("flash_qla", "tilelang", ...)."""
    names = sorted({line.rsplit(" -> ", 1)[-1] for line in ran})
    return "+".join(names) if names else "triton"


def references(op: str) -> tuple[Reference, ...]:
    """The fla paths timed for op here. Without a backend package installed, "as installed" is
    the Triton path, timed once (as fla_triton)."""
    if any(installed_backends().values()):
        return REFERENCES[op]
    return tuple(ref for ref in REFERENCES[op] if ref.name != "fla_installed")


def installed_backends() -> dict[str, bool]:
    """Whether each optional backend package fla can dispatch to is importable here."""
    return {package: importlib.util.find_spec(package) is not None for package in FLA_BACKENDS}


def add_errors(mine: Callable, paths: dict, x: dict, row: dict) -> None:
    """rel_o_vs_<path> for every fla path that ran forward, and the gradients' errors against
    the first one that ran forward+backward (rel_grad_vs_fla, its name in rel_grad_ref)."""
    with torch.no_grad():
        o = mine(x).float()
        for name, (fn, switches) in paths.items():
            if row.get(f"{name}_fwd"):
                with switched(switches):
                    o_ref = fn(x).float()
                row[f"rel_o_vs_{name}"] = ((o - o_ref).norm() / o_ref.norm()).item()
    first = next((name for name in paths if row.get(f"{name}_fb")), None)
    if first is not None:
        fn, switches = paths[first]
        with switched(switches):
            row["rel_grad_vs_fla"] = grad_errors({"ours": mine, "fla": fn}, x)
        row["rel_grad_ref"] = first


def grad_errors(impls: dict, x: dict) -> dict:
    """|d_ours - d_fla| / |d_fla| per input, one backward each with the same output gradient: the
    GPU check of our backward (the interpreter tests check it against float64 on the CPU)."""
    leaves = [name for name, t in x.items() if t.requires_grad]
    grads = {}
    do = None
    for name in ("ours", "fla"):
        for t in x.values():
            t.grad = None
        out = impls[name](x)
        do = torch.randn_like(out) if do is None else do
        out.backward(do)
        grads[name] = {n: x[n].grad.float().clone() for n in leaves}
    for t in x.values():
        t.grad = None
    return {n: ((grads["ours"][n] - grads["fla"][n]).norm() / grads["fla"][n].norm()).item()
            for n in leaves}
