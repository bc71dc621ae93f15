"""Latent thought vectors: per-sequence Gaussian posteriors fitted by a short inner loop. Their
honest evaluation (a bound on the likelihood, and a conditional likelihood of a suffix given its
prefix that sits beside a plain language model's) is `ltm.latent.evaluate`.

Each sequence x gets its own diagonal Gaussian q(z) = N(mu, exp(log_var)) over its latents
z (n_layers * n_latent, d_model). The inner loop minimises, per sequence, the negative ELBO

    NELBO(q) = E_q[-log p(x | z)] + kl_weight * KL(q || N(0, I)),

E_q estimated with one reparameterised sample z = mu + exp(log_var / 2) * eps. For kl_weight = 1,
NELBO(q) >= -log p(x) for every q, whatever the inner loop did: that is the bound reported.
q starts (train.latent.init) where the authors start it (mu near 0, a narrow sigma), at the prior
N(0, I), or where an encoder of the sequence puts it (semi-amortised, ltm.latent.encoder).

The inner step (`inner_step`) needs the gradient with respect to z only: the fitter freezes the
decoder while it runs, so no weight gradient is formed, and the head's loss goes through
ltm.model.cross_entropy without keeping logits. With compile, the NLL's forward and backward are compiled
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
from typing import Callable, Iterable, Literal

import torch
import torch.nn.functional as F

from ltm.model.cross_entropy import fused_row_nll
from ltm.model.cross_entropy import CHUNK_LOGITS, IGNORE_INDEX
from ltm.params import ParamsError, check
from ltm.model.lm import LTM, ModelConfig


# (z, *data) -> (B,) summed token NLL of each sequence given its latents z (B, L, D)
SequenceNLL = Callable[..., torch.Tensor]
# data -> (mu, log_var) (B, L, D) each: q's start predicted from the data (train.latent.init encoder)
Start = Callable[[tuple], tuple[torch.Tensor, torch.Tensor]]


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
    # q's start, before the inner steps. authors: mu ~ mu_init_std * N(0, 1), log_var =
    # log_var_init (a narrow q); prior: q = N(0, I); encoder: (mu, log_var) predicted from the
    # sequence by ltm.latent.encoder (semi-amortised: the steps refine it)
    init: Literal["authors", "prior", "encoder"] = "authors"
    mu_init_std: float = 0.01
    log_var_init: float = -5.0
    # init encoder: blocks of the encoder (slot queries cross-attending to the tokens, then an MLP)
    encoder_layers: int = 1
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
    # final metrics: the importance-weighted bound with each of these numbers of samples of q
    # fitted by the last of eval_steps (val_iwae_by_samples); [] = none
    iwae_samples: list[int] = dataclasses.field(default_factory=lambda: [1, 8, 64])

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
        check(self.encoder_layers >= 1, "encoder_layers",
              f"must be >= 1, got {self.encoder_layers}")
        check(all(k >= 1 for k in self.iwae_samples), "iwae_samples",
              f"must all be >= 1, got {self.iwae_samples}")
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
    the loss go through ltm.model.cross_entropy a chunk of rows at a time, keeping no logits. Without
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
    (B,) summed NLL per sequence; `decoder`: the parameters frozen while fitting; start: q's
    start from the data, which cfg.init encoder needs (see `initial`). compile:
    torch.compile the nll, whose forward and backward (to z alone) then run as compiled graphs,
    the same ones at every step (the step index and size are tensors; the KL and the update stay
    eager: a few elementwise kernels on z-sized tensors). fullgraph: fail on a graph break
    instead of running the broken part eagerly."""

    def __init__(self, nll: SequenceNLL, cfg: LatentConfig, compile: bool = False,
                 fullgraph: bool = False, decoder: Iterable[torch.nn.Parameter] = (),
                 start: Start | None = None) -> None:
        self.nll, self.cfg, self.decoder, self.start = nll, cfg, list(decoder), start
        self.step_nll = torch.compile(nll, fullgraph=fullgraph) if compile else nll
        self.step_fn = functools.partial(inner_step, self.step_nll, cfg)

    def _step(self, *args) -> torch.Tensor:
        """One inner step (inner_step's arguments after cfg), the decoder frozen for it."""
        with frozen(self.decoder):
            return self.step_fn(*args)

    def initial(self, data: tuple, noise: torch.Tensor,
                start: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """q's start (mu, log_var), new float32 tensors of noise's shape (B, L, D) that the steps
        update in place: `start` where given (the training step passes the encoder's output it
        trains), else by cfg.init: authors mu = mu_init_std * noise, log_var = log_var_init;
        prior 0 and 0; encoder the fitter's start(data), without gradients."""
        cfg = self.cfg
        if start is None and cfg.init == "encoder":
            if self.start is None:
                raise ParamsError("train.latent.init: 'encoder' needs a start from the data (the "
                                  "model's encoder), this fitter has none")
            with torch.no_grad():
                start = self.start(data)
        if start is not None:
            if any(tuple(t.shape) != tuple(noise.shape) for t in start):
                raise ValueError(f"start: expected (mu, log_var) of shape {tuple(noise.shape)}, "
                                 f"got {[tuple(t.shape) for t in start]}")
            return tuple(t.detach().to(torch.float32, copy=True) for t in start)
        if cfg.init == "prior":
            return torch.zeros_like(noise), torch.zeros_like(noise)
        return cfg.mu_init_std * noise, torch.full_like(noise, cfg.log_var_init)

    def fit(self, data: tuple, shape: tuple[int, ...], steps: int | None = None,
            generator: torch.Generator | None = None,
            start: tuple[torch.Tensor, torch.Tensor] | None = None) -> Posterior:
        """Fit q for the batch `data` (the nll's tensors, e.g. (x, y)) with `steps` inner steps
        (default cfg.steps) from q's initial state (see `initial`; start: given instead); z of
        `shape` (B, L, D). Draws the authors' initial mu and the noise from `generator`
        (default: the global generator), the first for every init: all inits share the noise."""
        cfg, device = self.cfg, data[0].device
        steps = cfg.steps if steps is None else steps
        noise = torch.randn(shape, device=device, generator=generator)  # (B, L, D)
        mu, log_var = self.initial(data, noise, start)
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


def encoder_start(model: LTM, data: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """(mu, log_var) (B, n_layers * n_latent, d_model) each of model.encoder (ltm.latent.encoder)
    for data = (x, y): it reads the input tokens x (B, T) as the decoder embeds them, detached
    (the embedding is the decoder's, trained by the decoder's loss alone)."""
    return model.encoder(model.embed(data[0]).detach())


def decoder_fitter(model: LTM, cfg: LatentConfig, compile: bool = False,
                   fullgraph: bool = False) -> PosteriorFitter:
    """The inner loop of a latent LTM, data = (x, y) (B, T) each; the model frozen while fitting;
    with cfg.init encoder, q starts at the model's encoder's prediction."""
    start = None
    if cfg.init == "encoder" and model.cfg.n_latent > 0:
        if model.encoder is None:
            raise ParamsError("train.latent.init: 'encoder' needs the model's encoder "
                              "(ltm.latent.encoder.attach_encoder), this model has none")
        start = functools.partial(encoder_start, model)
    return PosteriorFitter(functools.partial(sequence_nll, model), cfg, compile, fullgraph,
                           model.parameters(), start)


# ---------------------------------------------------------------------------------------------
# Evaluation. Every function returns sums (over sequences and tokens) so that batches and
# processes combine exactly; metrics are ratios of the totals (token-weighted means).
