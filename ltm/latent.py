"""Latent thought vectors: per-sequence Gaussian posteriors fitted by a short inner loop, and
honest evaluation of a latent model (a bound on the likelihood, and a conditional likelihood of a
suffix given its prefix that sits beside a plain language model's).

Each sequence x gets its own diagonal Gaussian q(z) = N(mu, exp(log_var)) over its latents
z (n_layers * n_latent, d_model). The inner loop minimises, per sequence, the negative ELBO

    NELBO(q) = E_q[-log p(x | z)] + kl_weight * KL(q || N(0, I)),

E_q estimated with one reparameterised sample z = mu + exp(log_var / 2) * eps. For kl_weight = 1,
NELBO(q) >= -log p(x) for every q, whatever the inner loop did: that is the bound reported.

The inner step (`inner_step`) needs the gradient with respect to z only: the fitter freezes the
decoder while it runs, so no weight gradient is formed, and the head's loss goes through
ltm.fused_nll without keeping logits. With compile, the NLL's forward and backward are compiled
graphs, reused at every step (the step index and size are tensors); the optimiser update is
written out by hand, in place on the moment buffers.

    fitter = PosteriorFitter(functools.partial(sequence_nll, model), LatentConfig())
    post = fitter.fit((x, y), latent_shape(model.cfg, len(x)))
    z = post.sample()                                         # (B, n_layers * n_latent, d_model)
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from typing import TYPE_CHECKING, Callable, Iterable, Literal

import torch
import torch.nn.functional as F

from ltm.fused_nll import fused_row_nll
from ltm.losses import CHUNK_LOGITS, IGNORE_INDEX
from ltm.params import check

if TYPE_CHECKING:
    from ltm.model import LTM, ModelConfig

# (z, *data) -> (B,) summed token NLL of each sequence given its latents z (B, L, D)
SequenceNLL = Callable[..., torch.Tensor]


@dataclasses.dataclass
class LatentConfig:
    """`train.latent`: the posterior of each sequence's latent thoughts and its inner loop.
    Defaults: the recipe of Latent Thought Models (Kong et al., ICML 2025)."""

    # inner steps per training batch (0 = train the decoder without latents)
    steps: int = 16
    optimizer: Literal["adamw", "adam", "sgd"] = "adamw"
    # first step size; the authors' initial fast learning rate
    lr: float = 0.3
    # cosine: from lr down to lr * final_fraction over the steps; constant: lr throughout
    schedule: Literal["cosine", "constant"] = "cosine"
    final_fraction: float = 0.1
    # adam / adamw moments and epsilon (torch's defaults, which the authors kept)
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    # adamw only: decoupled decay of mu and log_var (torch's AdamW default)
    weight_decay: float = 0.01
    # q's start: mu ~ mu_init_std * N(0, 1), log_var = log_var_init (a narrow q)
    mu_init_std: float = 0.01
    log_var_init: float = -5.0
    # one noise sample per sequence for all inner steps, and for the decoder's sample
    reuse_noise: bool = True
    # weight of the KL in the inner objective; the reported bound always weighs it 1
    kl_weight: float = 1.0
    # torch.compile the inner step; auto = as train.opt.compile
    compile: bool | Literal["auto"] = False
    # final metrics: the bound and the prefix NLL after each of these numbers of inner steps
    # (val_nelbo_by_steps, val_prefix_nll_by_steps)
    eval_steps: list[int] = dataclasses.field(default_factory=lambda: [0, 4, 16, 64])
    # validation pieces (batches) of those curves, the first ones; null = all of them
    eval_batches: int | None = None
    # samples of z averaged in E_q[NLL] of the reported bound
    eval_samples: int = 1

    def __post_init__(self):
        check(self.steps >= 0, "steps", f"must be >= 0, got {self.steps}")
        check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
        check(0 < self.final_fraction <= 1, "final_fraction",
              f"must be in (0, 1], got {self.final_fraction}")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            check(0 <= value < 1, name, f"must be in [0, 1), got {value}")
        check(self.eps > 0, "eps", f"must be > 0, got {self.eps}")
        check(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}")
        check(self.mu_init_std >= 0, "mu_init_std", f"must be >= 0, got {self.mu_init_std}")
        check(math.isfinite(self.log_var_init), "log_var_init",
              f"must be finite, got {self.log_var_init}")
        check(self.kl_weight >= 0, "kl_weight", f"must be >= 0, got {self.kl_weight}")
        check(all(s >= 0 for s in self.eval_steps), "eval_steps",
              f"must all be >= 0, got {self.eval_steps}")
        check(self.eval_samples >= 1, "eval_samples", f"must be >= 1, got {self.eval_samples}")
        check(self.eval_batches is None or self.eval_batches >= 1, "eval_batches",
              f"must be >= 1 or null, got {self.eval_batches}")


def latent_shape(cfg: ModelConfig, batch: int) -> tuple[int, int, int]:
    """Shape of z for `batch` sequences: (B, n_layers * n_latent, d_model)."""
    return (batch, cfg.n_layers * cfg.n_latent, cfg.d_model)


def gaussian_kl(mu: torch.Tensor, log_var: torch.Tensor) -> torch.Tensor:
    """KL(N(mu, exp(log_var)) || N(0, I)) per sequence: mu, log_var (B, ...) -> (B,)."""
    return 0.5 * (mu.square() + log_var.exp() - 1 - log_var).flatten(1).sum(1)


def sequence_nll(model: LTM, z: torch.Tensor | None, x: torch.Tensor,
                 y: torch.Tensor) -> torch.Tensor:
    """Summed token NLL per sequence (B,) of targets y (B, T) given tokens x (B, T) and latents
    z (B, L, D) or None; targets equal to IGNORE_INDEX count nothing. Float32 log-softmax, also
    under autocast. Inside the inner loop (the decoder frozen, z requiring a gradient) the head and
    the loss go through ltm.fused_nll a chunk of rows at a time, keeping no logits. Without
    gradients (evaluation) the logits are made a few sequences at a time, at most CHUNK_LOGITS of
    them, as the chunked training loss bounds them."""
    hidden = model.hidden(x, z)  # (B, T, D)
    B, T = y.shape
    weight = model.lm_head.weight  # (V, D)
    if torch.is_grad_enabled() and hidden.requires_grad and not weight.requires_grad:
        return fused_row_nll(hidden.flatten(0, 1), weight, y.flatten()).view(B, T).sum(1)
    rows = B if torch.is_grad_enabled() else max(1, CHUNK_LOGITS // (T * model.cfg.vocab_size))
    out = []
    for start in range(0, B, rows):
        logits = model.lm_head(hidden[start:start + rows])  # (rows, T, V)
        nll = F.cross_entropy(logits.flatten(0, 1).float(), y[start:start + rows].flatten(),
                              ignore_index=IGNORE_INDEX, reduction="none")  # 0 where ignored
        out.append(nll.view(-1, T).sum(1))
    return torch.cat(out)


def token_counts(y: torch.Tensor) -> torch.Tensor:
    """Scored targets per sequence (B,) of y (B, T)."""
    return (y != IGNORE_INDEX).sum(1)


def step_sizes(cfg: LatentConfig, steps: int, device: torch.device) -> torch.Tensor:
    """Step size of each inner step (steps,): cosine from lr to lr * final_fraction (step k of n
    at 0.5 * (1 + cos(pi * k / n))), or constant."""
    k = torch.arange(steps, dtype=torch.float32, device=device)
    if cfg.schedule == "constant":
        return torch.full_like(k, cfg.lr)
    low = cfg.lr * cfg.final_fraction
    return low + 0.5 * (1 + torch.cos(math.pi * k / max(steps, 1))) * (cfg.lr - low)


def _update(param: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
            t: torch.Tensor, lr: torch.Tensor, cfg: LatentConfig) -> None:
    """One optimiser step on `param`, in place; m, v: its moment buffers (unused by sgd); t: the
    1-based step index, lr: the step size, both 0-dim tensors."""
    if cfg.optimizer == "sgd":
        param.sub_(lr * grad)
        return
    m.lerp_(grad, 1 - cfg.beta1)
    v.mul_(cfg.beta2).addcmul_(grad, grad, value=1 - cfg.beta2)
    if cfg.optimizer == "adamw":
        param.mul_(1 - lr * cfg.weight_decay)
    m_hat = m / (1 - cfg.beta1 ** t)
    v_hat = v / (1 - cfg.beta2 ** t)
    param.sub_(lr * m_hat / (v_hat.sqrt() + cfg.eps))


def inner_step(nll: SequenceNLL, cfg: LatentConfig, data: tuple, mu: torch.Tensor,
               log_var: torch.Tensor, eps: torch.Tensor, state: tuple, t: torch.Tensor,
               lr: torch.Tensor) -> torch.Tensor:
    """One step of the inner loop, in place on mu, log_var (B, L, D) and the moment buffers
    `state` (m_mu, v_mu, m_log_var, v_log_var). Returns the batch mean of the objective
    (NLL + kl_weight * KL per sequence) at the parameters before the step, 0-dim.

    The gradient is that of the sum over sequences, i.e. each sequence's own objective, so no
    step depends on the batch size. Only mu and log_var get gradients: with the decoder frozen
    (PosteriorFitter does that) no weight gradient is formed, not even inside a compiled nll."""
    with torch.enable_grad():
        mu_leaf = mu.detach().requires_grad_()
        log_var_leaf = log_var.detach().requires_grad_()
        z = mu_leaf + eps * torch.exp(0.5 * log_var_leaf)  # (B, L, D)
        objective = nll(z, *data) + cfg.kl_weight * gaussian_kl(mu_leaf, log_var_leaf)  # (B,)
        grad_mu, grad_log_var = torch.autograd.grad(objective.sum(), [mu_leaf, log_var_leaf])
    with torch.no_grad():
        _update(mu, grad_mu, state[0], state[1], t, lr, cfg)
        _update(log_var, grad_log_var, state[2], state[3], t, lr, cfg)
    return objective.detach().mean()


@contextlib.contextmanager
def frozen(params: Iterable[torch.nn.Parameter]):
    """requires_grad False on `params` for the block, then as before: the inner loop's backward
    reaches z through the decoder without forming a single weight gradient."""
    params = [p for p in params if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


@dataclasses.dataclass
class Posterior:
    """Fitted q(z) of a batch: mu, log_var, eps (B, L, D); eps is the noise the inner loop used
    (the last step's without reuse_noise). objective (steps,): the batch-mean objective before
    each step."""

    mu: torch.Tensor
    log_var: torch.Tensor
    eps: torch.Tensor
    objective: torch.Tensor

    def sample(self, eps: torch.Tensor | None = None) -> torch.Tensor:
        """z = mu + sigma * eps (B, L, D), detached; eps defaults to the inner loop's noise."""
        eps = self.eps if eps is None else eps
        return (self.mu + torch.exp(0.5 * self.log_var) * eps).detach()

    def kl(self) -> torch.Tensor:
        """KL(q || N(0, I)) per sequence (B,)."""
        return gaussian_kl(self.mu, self.log_var)


class PosteriorFitter:
    """The inner loop for one decoder: `fit` returns the posterior of a batch. nll(z, *data) ->
    (B,) summed NLL per sequence; `decoder`: the parameters frozen while fitting. compile:
    torch.compile the nll, whose forward and backward (to z alone) then run as compiled graphs,
    the same ones at every step (the step index and size are tensors; the KL and the update stay
    eager: a few elementwise kernels on z-sized tensors). fullgraph: fail on a graph break
    instead of running the broken part eagerly."""

    def __init__(self, nll: SequenceNLL, cfg: LatentConfig, compile: bool = False,
                 fullgraph: bool = False, decoder: Iterable[torch.nn.Parameter] = ()) -> None:
        self.nll, self.cfg, self.decoder = nll, cfg, list(decoder)
        self.step_nll = torch.compile(nll, fullgraph=fullgraph) if compile else nll
        self.step_fn = functools.partial(inner_step, self.step_nll, cfg)

    def _step(self, *args) -> torch.Tensor:
        """One inner step (inner_step's arguments after cfg), the decoder frozen for it."""
        with frozen(self.decoder):
            return self.step_fn(*args)

    def fit(self, data: tuple, shape: tuple[int, ...], steps: int | None = None,
            generator: torch.Generator | None = None) -> Posterior:
        """Fit q for the batch `data` (the nll's tensors, e.g. (x, y)) with `steps` inner steps
        (default cfg.steps) from q's initial state; z of `shape` (B, L, D). Draws the initial mu
        and the noise from `generator` (default: the global generator)."""
        cfg, device = self.cfg, data[0].device
        steps = cfg.steps if steps is None else steps
        mu = cfg.mu_init_std * torch.randn(shape, device=device, generator=generator)  # (B, L, D)
        log_var = torch.full(shape, cfg.log_var_init, device=device)
        eps = torch.randn(shape, device=device, generator=generator)
        state = tuple(torch.zeros(shape, device=device) for _ in range(4))
        lrs = step_sizes(cfg, steps, device)  # (steps,)
        ts = torch.arange(1, steps + 1, dtype=torch.float32, device=device)  # (steps,)
        objective = []
        with frozen(self.decoder):
            for k in range(steps):
                if k > 0 and not cfg.reuse_noise:
                    eps = torch.randn(shape, device=device, generator=generator)
                objective.append(self.step_fn(data, mu, log_var, eps, state, ts[k], lrs[k]))
        objective = torch.stack(objective) if objective else torch.zeros(0, device=device)
        return Posterior(mu, log_var, eps, objective)


def decoder_fitter(model: LTM, cfg: LatentConfig, compile: bool = False,
                   fullgraph: bool = False) -> PosteriorFitter:
    """The inner loop of a latent LTM, data = (x, y) (B, T) each; the model frozen while fitting."""
    return PosteriorFitter(functools.partial(sequence_nll, model), cfg, compile, fullgraph,
                           model.parameters())


# ---------------------------------------------------------------------------------------------
# Evaluation. Every function returns sums (over sequences and tokens) so that batches and
# processes combine exactly; metrics are ratios of the totals (token-weighted means).


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
    out = {}
    for n in steps:
        generator = torch.Generator(x.device).manual_seed(seed)
        out[n] = fitted_nelbo_sums(model, fitter, x, y, n, samples, generator)
    return out


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


def _curve_size(eval_steps: list[int]) -> int:
    """Sums per batch of the curves by inference steps: (nll, kl, tokens) of the bound and
    (nll, tokens) of the prefix metric per count."""
    return 5 * len(eval_steps)


def _batch_sums(model: LTM, fitter: PosteriorFitter | None, x: torch.Tensor, y: torch.Tensor,
                full: bool, eval_steps: list[int], samples: int, seed: int,
                curves: bool = True) -> torch.Tensor:
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
            parts += nelbo_by_steps(model, fitter, x, y, eval_steps, samples, seed).values()
            parts += prefix_by_steps(model, fitter, x, y, eval_steps, seed).values()
        elif fitter is not None:
            parts.append(torch.zeros(_curve_size(eval_steps), dtype=torch.float64,
                                     device=x.device))
    return torch.cat(parts)


def validation_metrics(model: LTM, fitter: PosteriorFitter | None, batches: Iterable,
                       full: bool = True, eval_steps: Iterable[int] = (), samples: int = 1,
                       seed: int = 0, reduce: Callable[[torch.Tensor], None] | None = None,
                       eval_batches: int | None = None) -> dict:
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
    only, the curves by inference steps: val_nelbo_by_steps {steps: val_nelbo} and
    val_prefix_nll_by_steps {steps: val_prefix_nll}, each count from q's initial state, over the
    first eval_batches batches of this process (None: all), the costly part of the evaluation."""
    eval_steps = list(eval_steps) if fitter is not None else []
    totals, pieces = None, []
    for i, (x, y) in enumerate(batches):
        curves = eval_batches is None or i < eval_batches
        sums = _batch_sums(model, fitter, x, y, full, eval_steps, samples, seed + i, curves)
        totals = sums if totals is None else totals + sums
        pieces.append(sums[:5].tolist() if full else None)
    if totals is None:  # no rows here (a process left without any): zeros keep reduce in step
        device = next(model.parameters()).device
        totals = torch.zeros(3 + (2 + _curve_size(eval_steps) if full else 0),
                             dtype=torch.float64, device=device)
    if reduce is not None:
        reduce(totals)
    metrics = _metrics_from_sums(totals.tolist(), fitter is not None, full, eval_steps)
    if full:
        metrics.update(_noise(pieces))
    return metrics


def _noise(pieces: list[list[float]]) -> dict:
    """val_loss_noise and val_prefix_nll_noise: the standard error of each over this process's
    pieces (their per-token values; None under two pieces), which the report weighs a change
    between runs against (ltm.compare)."""
    def standard_error(values: list[float]) -> float | None:
        if len(values) < 2:
            return None
        mean = sum(values) / len(values)
        return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))

    loss = [(nll + kl) / max(tokens, 1.0) for nll, kl, tokens, _, _ in pieces]
    prefix = [nll / max(tokens, 1.0) for _, _, _, nll, tokens in pieces]
    return {"val_loss_noise": standard_error(loss), "val_prefix_nll_noise": standard_error(prefix)}


def _metrics_from_sums(sums: list[float], latent: bool, full: bool, eval_steps: list[int]) -> dict:
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
            out["val_nelbo_by_steps"] = {
                n: per_token(*sums[5 + 3 * j: 8 + 3 * j]) for j, n in enumerate(eval_steps)}
            prefix = 5 + 3 * len(eval_steps)
            out["val_prefix_nll_by_steps"] = {
                n: sums[prefix + 2 * j] / max(sums[prefix + 2 * j + 1], 1.0)
                for j, n in enumerate(eval_steps)}
    return out
