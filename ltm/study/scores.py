"""Per-sequence scores of the study: the suffix's NLL per token given its prefix (targets
T // 2 .. given tokens before them) for each model and control, and the latent model's bound
(NLL + KL per token of the whole sequence) by inference steps for each start of q."""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

import torch
from torch.func import functional_call

from ltm.latent.evaluate import iwae_bounds, nelbo_sums
from ltm.latent.posterior import (LatentConfig, decoder_fitter, gaussian_kl, latent_shape,
                                  sequence_nll, token_counts)
from ltm.model.cross_entropy import IGNORE_INDEX
from ltm.model.lm import LTM

BATCH = 64  # sequences scored at once


def suffix_targets(y: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """y (B, T) with the prefix's targets (positions < prefix_len) ignored."""
    suffix = y.clone()
    suffix[:, :prefix_len] = IGNORE_INDEX
    return suffix


def _batches(x: torch.Tensor, y: torch.Tensor):
    for start in range(0, len(x), BATCH):
        yield x[start:start + BATCH], y[start:start + BATCH]


@torch.no_grad()
def suffix_nll(model: LTM, x: torch.Tensor, y: torch.Tensor, prefix_len: int,
               latents: Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None] = lambda x, y: None
               ) -> torch.Tensor:
    """Suffix NLL per token of each sequence (N,) float64; latents(x, y) -> z (B, L, D) or None
    for a batch, computed from whatever of the batch it chooses to read (the prefix, for a
    proper conditional likelihood)."""
    out = []
    for xb, yb in _batches(x, y):
        suffix = suffix_targets(yb, prefix_len)
        z = latents(xb, yb)
        out.append(sequence_nll(model, z, xb, suffix).double() / (suffix != IGNORE_INDEX).sum(1))
    return torch.cat(out).cpu()


def prefix_posterior_sample(model: LTM, latent: LatentConfig, prefix_len: int, steps: int,
                            seed: int):
    """latents(x, y) for suffix_nll: q fitted to the prefix's targets alone (start latent.init,
    `steps` inner steps), one sample at the inner loop's noise (the generator seeded per batch)."""
    fitter = decoder_fitter(model, latent)

    def latents(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        generator = torch.Generator(x.device).manual_seed(seed)
        with torch.enable_grad():
            post = fitter.fit((x[:, :prefix_len], y[:, :prefix_len]),
                              latent_shape(model.cfg, len(x)), steps, generator)
        return post.sample()  # (B, L, D)

    return latents


@torch.no_grad()
def own_and_shuffled_suffix_nll(model: LTM, x: torch.Tensor, y: torch.Tensor, prefix_len: int,
                                latents: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """suffix_nll (N,) each, with each batch's own z (latents(x, y)) and with another sequence's:
    z rolled by one within the batch. One fit serves both."""
    own, other = [], []
    for xb, yb in _batches(x, y):
        suffix = suffix_targets(yb, prefix_len)
        tokens = (suffix != IGNORE_INDEX).sum(1)
        z = latents(xb, yb)  # (B, L, D)
        own.append(sequence_nll(model, z, xb, suffix).double() / tokens)
        other.append(sequence_nll(model, z.roll(1, dims=0), xb, suffix).double() / tokens)
    return torch.cat(own).cpu(), torch.cat(other).cpu()


def dynamic_suffix_nll(model: LTM, x: torch.Tensor, y: torch.Tensor, prefix_len: int,
                       steps: int, lr: float) -> torch.Tensor:
    """Dynamic evaluation: for each sequence, a copy of the weights takes `steps` SGD steps of size
    lr on the prefix's mean NLL, then scores the suffix (N,) float64. The sequence's own copy:
    nothing carries over to the next one."""
    base = {name: p.detach() for name, p in model.named_parameters()}
    out = []
    for i in range(len(x)):
        xi, yi = x[i:i + 1], y[i:i + 1]
        params = {name: p.clone().requires_grad_() for name, p in base.items()}
        for _ in range(steps):
            logits = functional_call(model, params, (xi[:, :prefix_len],))[0]  # (1, p, V)
            loss = torch.nn.functional.cross_entropy(logits[0], yi[0, :prefix_len])
            grads = torch.autograd.grad(loss, list(params.values()))
            with torch.no_grad():
                params = {n: (p - lr * g).requires_grad_() for (n, p), g in zip(params.items(), grads)}
        with torch.no_grad():
            logits = functional_call(model, params, (xi,))[0]  # (1, T, V)
            out.append(torch.nn.functional.cross_entropy(
                logits[0, prefix_len:].double(), yi[0, prefix_len:]))
    return torch.stack(out).cpu()


def bound_curve(model: LTM, latent: LatentConfig, x: torch.Tensor, y: torch.Tensor,
                steps: list[int], seed: int) -> list[dict]:
    """The bound on -log p(x) per token, NLL + KL, of the whole sequences after each count of
    inference steps from latent.init, and the seconds the fits took per sequence."""
    fitter = decoder_fitter(model, latent)
    rows = []
    for n in steps:
        sums, seconds = torch.zeros(3, dtype=torch.float64, device=x.device), 0.0
        for xb, yb in _batches(x, y):
            generator = torch.Generator(x.device).manual_seed(seed)
            if x.device.type == "cuda":
                torch.cuda.synchronize(x.device)
            start = time.perf_counter()
            with torch.enable_grad():
                post = fitter.fit((xb, yb), latent_shape(model.cfg, len(xb)), n, generator)
            if x.device.type == "cuda":
                torch.cuda.synchronize(x.device)
            seconds += time.perf_counter() - start
            sums += nelbo_sums(model, xb, yb, post.mu, post.log_var, 1, generator)
        nll, kl, tokens = (float(v) for v in sums)
        rows.append({"init": latent.init, "steps": n, "nll": nll / tokens, "kl": kl / tokens,
                     "bound": (nll + kl) / tokens, "ms_per_sequence": 1000 * seconds / len(x)})
    return rows


def published_and_honest_bounds(model: LTM, latent: LatentConfig, x: torch.Tensor,
                                y: torch.Tensor, steps: int, seed: int,
                                iwae_samples: int = 64) -> dict[str, torch.Tensor]:
    """Per sequence (N,) float64, nats per token, with q fitted to the whole scored sequence by
    `steps` inner steps from latent.init:

    - reused_noise: NLL at z = mu + sigma * eps with the inner loop's own eps, + KL: the bound as
      the LTM authors report it (q and the noise both fitted to the scored text; biased low, not a
      bound in expectation);
    - fresh_noise: NLL at a fresh draw of eps, + KL: an unbiased estimate of the negative ELBO,
      an upper bound of -log p(x) per token;
    - iwae: the importance-weighted bound with `iwae_samples` draws, tighter, still a bound."""
    fitter = decoder_fitter(model, latent)
    rows = {"reused_noise": [], "fresh_noise": [], "iwae": []}
    for xb, yb in _batches(x, y):
        generator = torch.Generator(x.device).manual_seed(seed)
        with torch.enable_grad():
            post = fitter.fit((xb, yb), latent_shape(model.cfg, len(xb)), steps, generator)
        with torch.no_grad():
            tokens = token_counts(yb).double()  # (B,)
            kl = gaussian_kl(post.mu, post.log_var).double()  # (B,)
            fresh = torch.randn(post.mu.shape, device=x.device, generator=generator)
            rows["reused_noise"].append((sequence_nll(model, post.sample(), xb, yb).double() + kl) / tokens)
            rows["fresh_noise"].append((sequence_nll(model, post.sample(fresh), xb, yb).double() + kl) / tokens)
            iwae = iwae_bounds(fitter.nll, (xb, yb), post.mu, post.log_var, [iwae_samples], generator)
            rows["iwae"].append(iwae[0] / tokens)
    return {name: torch.cat(parts).cpu() for name, parts in rows.items()}


def with_init(latent: LatentConfig, init: str) -> LatentConfig:
    return dataclasses.replace(latent, init=init)
