"""The cost of latent thoughts' inner loop against plain training, on the device that runs it.

    rows = bench_latent(cfg, batch=4, seq_len=128, n_latent=4, inner_steps=2)

Three timings per implementation (eager, and compiled where asked), each the median of `repeats`
after `warmup`, at the model section's size:

  plain step    a plain model's training step: forward, backward, AdamW (the reference)
  inner step    one step of the inner loop of the latent model (ltm.latent.posterior.inner_step: forward,
                backward to mu and log sigma^2 through the decoder, the update of q)
  latent step   the latent model's whole training step: inner_steps inner steps, then the
                decoder's forward, backward and AdamW

Rows: group, case, impl, ms, x_plain (ms / the same implementation's plain step: the multiple
the issue asks for), speedup (the eager plain step's ms / ms, so that the figures' 1x line is the
eager plain step), tokens_per_s (training tokens per second of the plain and latent steps),
B, T, n_latent, inner_steps, error (None, or why it could not run; ms is then nan).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import torch

from ltm.bench.model import median_ms
from ltm.latent.posterior import LatentConfig, decoder_fitter, latent_shape, step_sizes
from ltm.train.objective import LossModel
from ltm.model.lm import LTM, ModelConfig
from ltm.params import check


@dataclass
class LatentBench:
    """`benchmark.latent`: the inner loop against a plain training step."""

    n_latent: int = 4
    inner_steps: int = 2  # inner steps in the timed latent step
    batch: int = 4
    seq_len: int = 128
    repeats: int = 3
    # compiled rows too (plain step, inner step, latent step); auto = on CUDA only (compiling
    # the inner step on a CPU takes minutes)
    compile: bool | Literal["auto"] = "auto"

    def __post_init__(self) -> None:
        for name in ("n_latent", "inner_steps", "batch", "seq_len", "repeats"):
            check(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")


def autocast(device: torch.device, amp: str):
    """bf16 / fp16 autocast, or none ("off")."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


def _train_step(loss_model: torch.nn.Module, step_model, optimizer, x, y, device, amp):
    def step():
        with autocast(device, amp):
            loss = step_model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def _models(cfg: ModelConfig, n_latent: int, device: torch.device):
    torch.manual_seed(0)
    plain = LTM(dataclasses.replace(cfg, n_latent=0)).to(device)
    torch.manual_seed(0)
    latent = LTM(dataclasses.replace(cfg, n_latent=n_latent)).to(device)
    return plain, latent


def time_steps(cfg: ModelConfig, batch: int, seq_len: int, n_latent: int, inner_steps: int,
               compile: bool, amp: str = "off", warmup: int = 1, repeats: int = 3,
               device: torch.device | str = "cpu", latent: LatentConfig | None = None) -> dict:
    """{"plain": ms, "inner": ms, "latent": ms} of one implementation (compile or not), float32
    weights under autocast `amp` ("off", "bf16"), random tokens."""
    device = torch.device(device)
    latent = dataclasses.replace(latent or LatentConfig(), steps=inner_steps, compile=compile)
    max_len = max(cfg.max_seq_len, seq_len)
    cfg = dataclasses.replace(cfg, max_seq_len=max_len)
    plain, model = _models(cfg, n_latent, device)
    x = torch.randint(cfg.vocab_size, (batch, seq_len), device=device)
    y = torch.randint(cfg.vocab_size, (batch, seq_len), device=device)
    out = {}
    # fused AdamW where CUDA runs it, as training does
    fused = device.type == "cuda"
    for name, net, settings in (("plain", plain, None), ("latent", model, latent)):
        loss_model = LossModel(net, False, compile, settings)
        step_model = torch.compile(loss_model) if compile else loss_model
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=fused)
        out[name] = median_ms(_train_step(loss_model, step_model, optimizer, x, y, device, amp),
                              device, warmup + (1 if compile else 0), repeats)
    # one inner step alone, on a posterior in its middle (steps as in training)
    fitter = decoder_fitter(model, latent, compile)
    shape = latent_shape(model.cfg, batch)
    mu = 0.01 * torch.randn(shape, device=device)
    log_var = torch.full(shape, latent.log_var_init, device=device)
    eps = torch.randn(shape, device=device)
    state = tuple(torch.zeros(shape, device=device) for _ in range(4))
    lrs = step_sizes(latent, inner_steps, device)
    t = torch.ones((), device=device)

    def inner():
        with autocast(device, amp):
            fitter._step((x, y), mu, log_var, eps, state, t, lrs[0])
    out["inner"] = median_ms(inner, device, warmup + (1 if compile else 0), repeats)
    return out


def bench_latent(cfg: ModelConfig, bench: LatentBench, device: torch.device | str = "cpu",
                 amp: str = "off", warmup: int = 1) -> list[dict]:
    """Rows of the inner loop's cost (see the module's docstring) at the size of cfg."""
    device = torch.device(device)
    compile = device.type == "cuda" if bench.compile == "auto" else bench.compile
    impls = ["eager"] + (["compiled"] if compile else [])
    group = f"latent training B={bench.batch} T={bench.seq_len}"
    cases = {"plain": "plain step", "inner": "inner step",
             "latent": f"latent step ({bench.inner_steps} inner)"}
    rows, eager_plain = [], math.nan
    for impl in impls:
        try:
            ms = time_steps(cfg, bench.batch, bench.seq_len, bench.n_latent, bench.inner_steps,
                            impl == "compiled", amp, warmup, bench.repeats, device)
            error = None
        except Exception as err:  # a compiler that cannot run here: a row that says so
            ms, error = dict.fromkeys(cases, math.nan), f"{type(err).__name__}: {err}"[:300]
        if impl == "eager":
            eager_plain = ms["plain"]
        tokens = bench.batch * bench.seq_len
        for key, case in cases.items():
            rows.append({
                "group": group, "case": case, "impl": impl, "ms": ms[key],
                "x_plain": ms[key] / ms["plain"], "speedup": eager_plain / ms[key],
                "tokens_per_s": tokens / (ms[key] / 1e3) if key != "inner" else math.nan,
                "B": bench.batch, "T": bench.seq_len, "n_latent": bench.n_latent,
                "inner_steps": bench.inner_steps, "error": error})
    return rows
