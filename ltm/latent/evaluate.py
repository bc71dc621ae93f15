"""Honest evaluation of a latent model: the negative ELBO per token with q fitted by the inner
loop (an upper bound of -log p(x) / T), split into its NLL and KL, the importance-weighted bound
(IWAE, tighter with more samples), the conditional likelihood of a suffix given its prefix
(comparable with a plain language model's), by inference steps, and their noise over the
validation batches. A plain model (fitter None) gets its exact NLL in the same fields.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable

import torch

from ltm.latent.posterior import (PosteriorFitter, SequenceNLL, gaussian_kl, latent_shape,
                                  sequence_nll, token_counts)
from ltm.model.cross_entropy import IGNORE_INDEX
from ltm.model.lm import LTM



@torch.no_grad()
def nelbo_sums(model: LTM, x: torch.Tensor, y: torch.Tensor, mu: torch.Tensor,
               log_var: torch.Tensor, samples: int = 1,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """(sum of E_q[NLL], sum of KL, tokens) of a batch, float64 (3,). E_q[NLL] is the mean NLL
    over `samples` fresh draws z = mu + sigma * eps (eps from `generator`, not the inner loop's
    noise, which q was fitted to): an unbiased estimate of E_q[NLL], so nll + kl is an unbiased
    estimate of the negative ELBO, itself an upper bound of -log p(x). x, y (B, T); mu, log_var
    (B, L, D)."""
    nll = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)  # (B,)
    for _ in range(samples):
        eps = torch.randn(mu.shape, device=mu.device, generator=generator)
        nll += sequence_nll(model, mu + torch.exp(0.5 * log_var) * eps, x, y).double()
    kl = gaussian_kl(mu, log_var).double()  # (B,)
    tokens = token_counts(y).sum().double()
    return torch.stack([nll.sum() / samples, kl.sum(), tokens])


def nelbo_per_token(model: LTM, x: torch.Tensor, y: torch.Tensor, mu: torch.Tensor,
                    log_var: torch.Tensor, samples: int = 1,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """(sum NLL + sum KL) / tokens of a batch for the fixed posterior (mu, log_var), 0-dim: a
    Monte-Carlo estimate (`samples` draws of z) of the negative ELBO per token, which is an upper
    bound of -log p(x) / T in expectation; exp of it bounds the perplexity. See nelbo_sums."""
    nll, kl, tokens = nelbo_sums(model, x, y, mu, log_var, samples, generator)
    return (nll + kl) / tokens.clamp(min=1)


def fitted_nelbo_sums(model: LTM, fitter: PosteriorFitter, x: torch.Tensor, y: torch.Tensor,
                      steps: int | None = None, samples: int = 1,
                      generator: torch.Generator | None = None) -> torch.Tensor:
    """nelbo_sums (3,) of the posterior fitted to (x, y) by `steps` inner steps (0 = q's
    initial state: mu ~ 0, log_var = log_var_init, whose KL to the prior is large)."""
    post = fitter.fit((x, y), latent_shape(model.cfg, x.shape[0]), steps, generator)
    return nelbo_sums(model, x, y, post.mu, post.log_var, samples, generator)


def nelbo_by_steps(model: LTM, fitter: PosteriorFitter, x: torch.Tensor, y: torch.Tensor,
                   steps: Iterable[int], samples: int = 1,
                   seed: int = 0) -> dict[int, torch.Tensor]:
    """{steps: nelbo_sums (3,)} of a batch. Every count starts from the same initial q and noise
    (one seed) and runs its own schedule (a cosine over n steps, not the first n of a longer
    one), as training with that many steps would."""
    return bounds_by_steps(model, fitter, x, y, list(steps), samples, seed)[0]


def bounds_by_steps(model: LTM, fitter: PosteriorFitter, x: torch.Tensor, y: torch.Tensor,
                    steps: list[int], samples: int = 1, seed: int = 0,
                    iwae_samples: Iterable[int] = ()
                    ) -> tuple[dict[int, torch.Tensor], torch.Tensor | None]:
    """({steps: nelbo_sums (3,)}, iwae) of a batch, as nelbo_by_steps; iwae: float64
    (len(iwae_samples) + 1,), the importance-weighted bound summed over the sequences for each
    number of samples (see iwae_bounds), then the tokens, of the q of the last count (the
    curve's end; the same q and the same generator, drawn on after the NELBO's samples), or None
    without iwae_samples or steps."""
    out, iwae, iwae_samples = {}, None, list(iwae_samples)
    for j, n in enumerate(steps):
        generator = torch.Generator(x.device).manual_seed(seed)
        post = fitter.fit((x, y), latent_shape(model.cfg, x.shape[0]), n, generator)
        out[n] = nelbo_sums(model, x, y, post.mu, post.log_var, samples, generator)
        if iwae_samples and j == len(steps) - 1:
            bounds = iwae_bounds(fitter.nll, (x, y), post.mu, post.log_var, iwae_samples, generator)
            iwae = torch.cat([bounds.sum(1), token_counts(y).sum().double()[None]])
    return out, iwae


@torch.no_grad()
def iwae_bounds(nll: SequenceNLL, data: tuple, mu: torch.Tensor, log_var: torch.Tensor,
                samples: Iterable[int], generator: torch.Generator | None = None) -> torch.Tensor:
    """The importance-weighted bound (Burda et al. 2016) per sequence for each K of `samples`,
    float64 (len(samples), B):

        -log (1/K sum_k w_k),   w_k = p(x | z_k) p(z_k) / q(z_k),   z_k ~ q = N(mu, exp(log_var))

    with nll(z, *data) = -log p(x | z) per sequence (B,), mu, log_var (B, L, D), p(z) = N(0, I).
    Its mean is an upper bound of -log p(x) for every K, tighter as K grows (to -log p(x)), and at
    K = 1 the NELBO's. One draw set: bound K uses the first K of max(samples) draws (eps from
    `generator`), so the bounds share their noise and cost max(samples) evaluations of nll."""
    ks = list(samples)
    log_w = []
    for _ in range(max(ks)):
        eps = torch.randn(mu.shape, device=mu.device, generator=generator)  # (B, L, D)
        z = mu + torch.exp(0.5 * log_var) * eps
        # log p(z) - log q(z): the Gaussians' 2 pi terms cancel, q's log-determinant stays
        log_ratio = 0.5 * (eps.double().square() - z.double().square()
                           + log_var.double()).flatten(1).sum(1)  # (B,)
        log_w.append(log_ratio - nll(z, *data).double())
    log_w = torch.stack(log_w)  # (max K, B)
    return torch.stack([math.log(k) - torch.logsumexp(log_w[:k], dim=0) for k in ks])


def prefix_sums(model: LTM, fitter: PosteriorFitter | None, x: torch.Tensor, y: torch.Tensor,
                prefix_len: int | None = None, steps: int | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """(sum of NLL, tokens) of the suffix given the prefix, float64 (2,). The first prefix_len
    (default T // 2) positions are the prefix: with a fitter, q is fitted to their targets alone
    (NLL + KL over the prefix) and the suffix, positions prefix_len.., is scored given one sample
    z of that q (the inner loop's own noise, as the decoder is trained: z = mu alone is a point
    the decoder never saw when sigma is not small). Position p's input is x_p and the fitted
    targets are x_1..x_p, so z depends on what the first scored position sees anyway plus noise
    independent of the suffix: -log p(suffix | prefix, z) is a proper conditional
    log-likelihood (no KL enters), and its mean over z bounds from above the NLL of the
    predictive averaged over q (Jensen). fitter None (a plain LM, or a latent model trained
    without latents): the same suffix NLL without z, so both sit side by side."""
    p = x.shape[1] // 2 if prefix_len is None else prefix_len
    if not 0 < p < x.shape[1]:
        raise ValueError(f"prefix_len: expected 1..{x.shape[1] - 1}, got {p}")
    z = None
    if fitter is not None:
        post = fitter.fit((x[:, :p], y[:, :p]), latent_shape(model.cfg, x.shape[0]), steps,
                          generator)
        z = post.sample()  # (B, L, D)
    suffix = y.clone()
    suffix[:, :p] = IGNORE_INDEX  # (B, T): the prefix's targets left out
    with torch.no_grad():
        nll = sequence_nll(model, z, x, suffix).double().sum()
    return torch.stack([nll, token_counts(suffix).sum().double()])


def prefix_by_steps(model: LTM, fitter: PosteriorFitter, x: torch.Tensor, y: torch.Tensor,
                    steps: Iterable[int], seed: int = 0) -> dict[int, torch.Tensor]:
    """{steps: prefix_sums (2,)} of a batch: the suffix given a z fitted to the prefix by that many
    inner steps, each count from the same initial q and noise (one seed), as nelbo_by_steps."""
    out = {}
    for n in steps:
        generator = torch.Generator(x.device).manual_seed(seed)
        out[n] = prefix_sums(model, fitter, x, y, steps=n, generator=generator)
    return out


def _curve_size(eval_steps: list[int], iwae_samples: list[int] = ()) -> int:
    """Sums per batch of the curves by inference steps: (nll, kl, tokens) of the bound and
    (nll, tokens) of the prefix metric per count, then the importance-weighted bounds and their
    tokens (where there are steps and samples)."""
    iwae = len(iwae_samples) + 1 if eval_steps and iwae_samples else 0
    return 5 * len(eval_steps) + iwae


def _batch_sums(model: LTM, fitter: PosteriorFitter | None, x: torch.Tensor, y: torch.Tensor,
                full: bool, eval_steps: list[int], samples: int, seed: int,
                curves: bool = True, iwae_samples: list[int] = ()) -> torch.Tensor:
    """One batch's sums in the layout of validation_metrics, float64; curves False: zeros in
    place of the curves by inference steps (a batch past eval_batches)."""
    generator = torch.Generator(x.device).manual_seed(seed)
    if fitter is None:
        with torch.no_grad():
            nll = sequence_nll(model, None, x, y).double().sum()
        parts = [torch.stack([nll, nll.new_zeros(()), token_counts(y).sum().double()])]
    else:
        parts = [fitted_nelbo_sums(model, fitter, x, y, None, samples, generator)]
    if full:
        parts.append(prefix_sums(model, fitter, x, y, generator=generator))
        if fitter is not None and curves:
            bounds, iwae = bounds_by_steps(model, fitter, x, y, eval_steps, samples, seed,
                                           iwae_samples)
            parts += bounds.values()
            parts += prefix_by_steps(model, fitter, x, y, eval_steps, seed).values()
            parts += [] if iwae is None else [iwae]
        elif fitter is not None:
            parts.append(torch.zeros(_curve_size(eval_steps, iwae_samples), dtype=torch.float64,
                                     device=x.device))
    return torch.cat(parts)


def validation_metrics(model: LTM, fitter: PosteriorFitter | None, batches: Iterable,
                       full: bool = True, eval_steps: Iterable[int] = (), samples: int = 1,
                       seed: int = 0, reduce: Callable[[torch.Tensor], None] | None = None,
                       eval_batches: int | None = None, iwae_samples: Iterable[int] = ()) -> dict:
    """Metrics of a validation set, batches of (x, y) (B, T) each; fitter None = a plain LM.
    Token-weighted over all batches; `reduce` sums a float64 tensor across processes in place.

    Latent model: val_nelbo (negative ELBO per token, q fitted by the training's inner steps,
    one fresh sample of z per sequence by default: an unbiased estimate of an upper bound of
    -log p(x) / T), val_ppl_bound = exp(val_nelbo), val_nll_given_fitted_z and
    val_kl_per_token (its two parts; the first alone is no likelihood: z was fitted to the very
    tokens it scores). Plain LM: val_nll, and val_nelbo = val_nll (exact, no latents).
    val_loss = val_nelbo for both. full adds val_prefix_nll / val_prefix_ppl, the suffix given
    the prefix (see prefix_sums), which is comparable across latent and plain models, the
    standard errors of val_loss and val_prefix_nll over the batches (see _noise) and, latent
    only, the curves by inference steps: val_nelbo_by_steps {steps: val_nelbo}, its parts
    val_nll_by_steps and val_kl_by_steps (per token, summing to it), and val_prefix_nll_by_steps
    {steps: val_prefix_nll}, each count from q's initial state, and (iwae_samples) the
    importance-weighted bound per token of the q of the last count (val_iwae_steps),
    val_iwae_by_samples {K: bound}, over the first eval_batches batches of this process (None:
    all), the costly part of the evaluation."""
    eval_steps = list(eval_steps) if fitter is not None else []
    iwae_samples = list(iwae_samples) if eval_steps else []
    totals, pieces = None, []
    for i, (x, y) in enumerate(batches):
        curves = eval_batches is None or i < eval_batches
        sums = _batch_sums(model, fitter, x, y, full, eval_steps, samples, seed + i, curves,
                           iwae_samples)
        totals = sums if totals is None else totals + sums
        pieces.append(sums[:5].tolist() if full else None)
    if totals is None:  # no rows here (a process left without any): zeros keep reduce in step
        device = next(model.parameters()).device
        totals = torch.zeros(3 + (2 + _curve_size(eval_steps, iwae_samples) if full else 0),
                             dtype=torch.float64, device=device)
    if reduce is not None:
        reduce(totals)
    metrics = _metrics_from_sums(totals.tolist(), fitter is not None, full, eval_steps,
                                 iwae_samples)
    if full:
        metrics.update(_noise(pieces))
    return metrics


def _noise(pieces: list[list[float]]) -> dict:
    """val_loss_noise and val_prefix_nll_noise: the standard error of each over this process's
    pieces (their per-token values; None under two pieces), which the report weighs a change
    between runs against (ltm.report.compare)."""
    def standard_error(values: list[float]) -> float | None:
        if len(values) < 2:
            return None
        mean = sum(values) / len(values)
        return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))

    loss = [(nll + kl) / max(tokens, 1.0) for nll, kl, tokens, _, _ in pieces]
    prefix = [nll / max(tokens, 1.0) for _, _, _, nll, tokens in pieces]
    return {"val_loss_noise": standard_error(loss), "val_prefix_nll_noise": standard_error(prefix)}


def _metrics_from_sums(sums: list[float], latent: bool, full: bool, eval_steps: list[int],
                       iwae_samples: list[int] = ()) -> dict:
    def per_token(nll: float, kl: float, tokens: float) -> float:
        return (nll + kl) / max(tokens, 1.0)

    nll, kl, tokens = sums[:3]
    nelbo = per_token(nll, kl, tokens)
    out = {"val_loss": nelbo, "val_nelbo": nelbo, "val_ppl_bound": math.exp(nelbo)}
    if latent:
        out.update(val_nll_given_fitted_z=per_token(nll, 0.0, tokens),
                   val_kl_per_token=per_token(0.0, kl, tokens))
    else:
        out["val_nll"] = nelbo
    if full:
        prefix_nll = sums[3] / max(sums[4], 1.0)
        out.update(val_prefix_nll=prefix_nll, val_prefix_ppl=math.exp(prefix_nll))
        if latent:
            bounds = {n: sums[5 + 3 * j: 8 + 3 * j] for j, n in enumerate(eval_steps)}
            out["val_nelbo_by_steps"] = {n: per_token(*b) for n, b in bounds.items()}
            out["val_nll_by_steps"] = {n: per_token(b[0], 0.0, b[2]) for n, b in bounds.items()}
            out["val_kl_by_steps"] = {n: per_token(0.0, b[1], b[2]) for n, b in bounds.items()}
            prefix = 5 + 3 * len(eval_steps)
            out["val_prefix_nll_by_steps"] = {
                n: sums[prefix + 2 * j] / max(sums[prefix + 2 * j + 1], 1.0)
                for j, n in enumerate(eval_steps)}
            if eval_steps and iwae_samples:
                iwae = sums[prefix + 2 * len(eval_steps):]  # one sum per K, then the tokens
                out["val_iwae_steps"] = eval_steps[-1]
                out["val_iwae_by_samples"] = {
                    k: per_token(iwae[j], 0.0, iwae[-1]) for j, k in enumerate(iwae_samples)}
    return out
