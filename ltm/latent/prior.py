"""A learned prior over latent thoughts: a small diffusion model over z, sampled in a few steps.

A latent-thought model generates by drawing z first. Its training prior is N(0, I), but the
posteriors the decoder learned to read sit elsewhere (the authors shrink N(0, I) by 0.5-1.0 by
hand). This module fits the distribution the decoder actually saw: a DiT-style denoiser over the
latent slots (the n_layers * n_latent vectors of z are its tokens), trained on posterior samples
of the training split (ltm.train.prior_trainer), with diffusers' noise schedule and solvers used
standalone: DDPMScheduler for the training noise and the 1000-step ancestral baseline,
DPMSolverMultistepScheduler (DPM-Solver++, multistep) for sampling in 5-50 evaluations.

    prior = load_prior("data/checkpoints/prior")
    z = prior.sample(16, steps=20)                          # (16, n_layers * n_latent, d_model)
    z = latents(model, "prior", 16, prior=prior)            # or "gaussian" (scale), "prompt"

The denoiser works on normalised z, (z - mean) / std per dimension over the training
posteriors (normalize), so that one noise schedule fits whatever scale the posteriors have, then
whitened along the posteriors' top `whiten_rank` principal directions: the coordinates in which
their low-rank + diagonal Gaussian fit is N(0, I). The denoiser's Gaussian skip makes that fit
what an untrained prior samples; the network learns only what the fit misses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Literal

import torch
import torch.nn.functional as F
from torch import nn

from ltm.latent.posterior import LatentConfig, decoder_fitter, latent_shape
from ltm.params import ParamsError, check, from_mapping
from ltm.model.lm import LTM


# the prior's folder inside the train stage's checkpoint folder, and its files
PRIOR_DIR = "prior"
PRIOR_FILE = "last.pt"
POSTERIOR_FILE = "posterior.pt"
# the latent and plain models' folders, relative to the checkpoint folder (the benchmark's way in)
MODELS_FILE = "models.json"
SAMPLERS = ("dpmsolver++", "ddpm")
# sinusoidal features of the timestep fed to the conditioning MLP (DiT's 256)
TIME_FEATURES = 256


@dataclass
class PriorConfig:
    """`prior`: the diffusion prior over latent thoughts, trained in the train stage after the
    models (ltm.train.prior_trainer). Defaults: the CPU default's, which must train in well under a
    minute on 2 cores."""
    enabled: bool = True
    # the denoiser: `depth` DiT blocks of `width` over the latent slots, adaLN-Zero conditioning;
    # each slot's d_model vector is cut into patches of `patch` numbers (or the largest divisor of
    # d_model below it), one token each (a token narrower than the data it predicts would
    # bottleneck it); null = a whole slot per token
    patch: int | None = 32
    width: int = 64
    depth: int = 2
    n_heads: int = 4
    mlp_ratio: int = 4
    # training: AdamW at a constant lr after a linear warm-up (no decay, so that a run resumed
    # with more steps continues exactly), an exponential moving average of the weights sampled
    steps: int = 400
    batch_size: int = 64
    lr: float = 0.001
    warmup_steps: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    ema: float = 0.99     # decay of the weights' average; 0 = sample the raw weights
    checkpoint_every: int = 200  # steps between checkpoints (and at the end)
    resume: bool = True
    # posterior samples: q(z | x) fitted by the latent model's own inner loop (its train.latent
    # settings, as it was trained) on this many training sequences; a fresh z ~ q per draw
    train_sequences: int = 384
    heldout_sequences: int = 256  # validation sequences, for the benchmark's z-distance
    fit_batch: int = 32
    normalize: bool = True  # per-dimension mean and std of the training posteriors
    # ... and the whitening of their top principal directions (0: per dimension only). The
    # posteriors vary together along a few directions (held-out |correlation| up to 0.8) that a
    # per-dimension normalisation leaves to the network; fitting them here costs one SVD
    whiten_rank: int = 16
    # the noise schedule (diffusers' DDPMScheduler), also the solvers'
    train_timesteps: int = 1000
    beta_schedule: Literal["linear", "scaled_linear", "squaredcos_cap_v2"] = "linear"
    beta_start: float = 0.0001
    beta_end: float = 0.02
    prediction_type: Literal["epsilon", "v_prediction"] = "epsilon"
    # sampling through the prior for generation (python -m ltm.generate --prior): DPM-Solver++
    sample_steps: int = 20
    solver_order: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("width", "depth", "n_heads", "mlp_ratio", "steps", "batch_size",
                     "train_sequences", "heldout_sequences", "fit_batch", "sample_steps"):
            check(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        check(self.patch is None or self.patch >= 1, "patch", f"must be >= 1, got {self.patch}")
        check(self.width % self.n_heads == 0, "n_heads",
              f"must divide width {self.width}, got {self.n_heads}")
        check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
        for name in ("warmup_steps", "checkpoint_every", "weight_decay", "grad_clip",
                     "whiten_rank"):
            check(getattr(self, name) >= 0, name, f"must be >= 0, got {getattr(self, name)}")
        check(self.whiten_rank < self.train_sequences, "whiten_rank",
              f"must be below train_sequences {self.train_sequences}, got {self.whiten_rank}")
        check(0 <= self.ema < 1, "ema", f"must be in [0, 1), got {self.ema}")
        check(self.train_timesteps >= 2, "train_timesteps",
              f"must be >= 2, got {self.train_timesteps}")
        check(0 < self.beta_start < self.beta_end < 1, "beta_end",
              f"need 0 < beta_start < beta_end < 1, got {self.beta_start}, {self.beta_end}")
        check(self.solver_order in (1, 2, 3), "solver_order",
              f"must be 1, 2 or 3, got {self.solver_order}")
        check(self.sample_steps <= self.train_timesteps, "sample_steps",
              f"must be <= train_timesteps {self.train_timesteps}, got {self.sample_steps}")


def timestep_features(t: torch.Tensor, dim: int = TIME_FEATURES) -> torch.Tensor:
    """Sinusoidal features (B, dim) of timesteps t (B,), periods up to 10000 steps."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device) / half)
    angles = t.float()[:, None] * freqs[None]
    return torch.cat([angles.cos(), angles.sin()], dim=1)


def _modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


class DiTBlock(nn.Module):
    """Self-attention and an MLP over the slots, each normalised, shifted and scaled by the
    timestep's embedding and gated (adaLN-Zero: the gates start at 0, so each block starts as
    the identity, which keeps the untrained denoiser's output at exactly 0)."""

    def __init__(self, width: int, n_heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm1 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, mlp_ratio * width), nn.GELU(),
                                 nn.Linear(mlp_ratio * width, width))
        self.ada = nn.Linear(width, 6 * width)
        nn.init.zeros_(self.ada.weight)
        nn.init.zeros_(self.ada.bias)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """x (B, L, W), c (B, W) -> (B, L, W)."""
        B, L, W = x.shape
        shift1, scale1, gate1, shift2, scale2, gate2 = self.ada(F.silu(c))[:, None].chunk(6, -1)
        h = _modulate(self.norm1(x), shift1, scale1)
        q, k, v = self.qkv(h).view(B, L, 3, self.n_heads, W // self.n_heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, L, W)
        x = x + gate1 * self.proj(attn)
        return x + gate2 * self.mlp(_modulate(self.norm2(x), shift2, scale2))


class Denoiser(nn.Module):
    """The noise (or v) predictor of normalised latents: (x_t (B, slots, dim), t (B,)) ->
    (B, slots, dim). Tokens are patches of the latent slots (cfg.patch numbers each) with a
    learned embedding of their position (slot i of layer l is its own: the decoder reads each
    layer's latents apart).

    `skip` (the noise schedule's sqrt(1 - alpha_bar_t), given for epsilon prediction) adds
    sqrt(1 - alpha_bar_t) * x_t to the output: the exact noise predictor for data of mean 0 and
    unit variance in every direction, which normalised z is to first order. The network learns
    only what differs from that Gaussian, and the untrained denoiser (its output layer starts at
    zero) already samples N(0, I) in normalised coordinates, i.e. the normalisation's Gaussian
    fit for z (Prior.decode of N(0, I)). For v
    prediction the Gaussian's predictor is 0: no skip."""

    def __init__(self, slots: int, dim: int, cfg: PriorConfig,
                 skip: torch.Tensor | None = None) -> None:
        super().__init__()
        # the largest patch that divides d_model and is at most cfg.patch: a model.d_model that
        # is not a multiple of prior.patch (48 with the default 32) still trains a prior
        patch = math.gcd(cfg.patch or dim, dim)
        width, self.patch = cfg.width, patch
        self.slots, self.dim, self.tokens = slots, dim, slots * dim // patch
        self.inp = nn.Linear(patch, width)
        self.pos = nn.Parameter(0.02 * torch.randn(self.tokens, width))
        self.time = nn.Sequential(nn.Linear(TIME_FEATURES, width), nn.SiLU(),
                                  nn.Linear(width, width))
        self.blocks = nn.ModuleList(DiTBlock(width, cfg.n_heads, cfg.mlp_ratio)
                                    for _ in range(cfg.depth))
        self.norm = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.final_ada = nn.Linear(width, 2 * width)
        self.out = nn.Linear(width, patch)
        for layer in (self.final_ada, self.out):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)
        # (train_timesteps,) or None; a buffer: it moves with the module and is saved with it
        self.register_buffer("skip", skip, persistent=True)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        B = x.shape[0]
        c = self.time(timestep_features(t))  # (B, W)
        h = self.inp(x.reshape(B, self.tokens, self.patch)) + self.pos  # (B, N, W)
        for block in self.blocks:
            h = block(h, c)
        shift, scale = self.final_ada(F.silu(c))[:, None].chunk(2, -1)
        out = self.out(_modulate(self.norm(h), shift, scale)).reshape(x.shape)
        if self.skip is not None:
            out = out + self.skip[t.long()].to(x.dtype)[:, None, None] * x
        return out


def gaussian_skip(cfg: PriorConfig) -> torch.Tensor | None:
    """Denoiser's skip for cfg: sqrt(1 - alpha_bar_t) per timestep (epsilon), None (v)."""
    if cfg.prediction_type != "epsilon":
        return None
    return (1 - make_scheduler(cfg, "ddpm").alphas_cumprod).sqrt().float()


def _schedule_kwargs(cfg: PriorConfig) -> dict:
    return dict(num_train_timesteps=cfg.train_timesteps, beta_schedule=cfg.beta_schedule,
                beta_start=cfg.beta_start, beta_end=cfg.beta_end,
                prediction_type=cfg.prediction_type)


def make_scheduler(cfg: PriorConfig, sampler: str = "ddpm"):
    """A fresh diffusers scheduler of cfg's noise schedule: "ddpm" (ancestral; also the training
    noise: add_noise, get_velocity) or "dpmsolver++" (multistep, order cfg.solver_order)."""
    from diffusers import DDPMScheduler, DPMSolverMultistepScheduler

    if sampler == "ddpm":
        # clip_sample would clip normalised z to [-1, 1]: z is not an image
        return DDPMScheduler(**_schedule_kwargs(cfg), clip_sample=False)
    if sampler == "dpmsolver++":
        return DPMSolverMultistepScheduler(**_schedule_kwargs(cfg), algorithm_type="dpmsolver++",
                                           solver_order=cfg.solver_order)
    raise ParamsError(f"sampler: expected one of {', '.join(SAMPLERS)}, got {sampler!r}")


@torch.no_grad()
def sample_with(eps_model: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                cfg: PriorConfig, shape: tuple[int, ...], steps: int,
                sampler: str = "dpmsolver++", device: torch.device | str = "cpu",
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Samples x_0 of `shape` (N, ...) by `steps` evaluations of eps_model(x_t, t (N,)), which
    predicts cfg.prediction_type. ddpm with steps = train_timesteps is the ancestral baseline.
    The noise is drawn on the CPU from `generator` (the same samples on every device)."""
    if not 1 <= steps <= cfg.train_timesteps:
        raise ParamsError(f"steps: must be in 1..{cfg.train_timesteps}, got {steps}")
    scheduler = make_scheduler(cfg, sampler)
    scheduler.set_timesteps(steps, device=device)
    x = torch.randn(shape, generator=generator).to(device) * scheduler.init_noise_sigma
    for t in scheduler.timesteps:
        out = eps_model(x, t.expand(shape[0]))
        if sampler == "ddpm":  # its variance noise, drawn by the scheduler from the same generator
            x = scheduler.step(out, t, x, generator=generator).prev_sample
        else:
            x = scheduler.step(out, t, x).prev_sample
    return x


def whiten(x: torch.Tensor, basis: torch.Tensor | None, gain: torch.Tensor | None,
           inverse: bool = False) -> torch.Tensor:
    """x (B, slots, dim) with its components along the orthonormal rows of basis (k, slots * dim)
    divided by gain (k,), their standard deviations (inverse: multiplied); None: x itself."""
    if basis is None or len(basis) == 0:
        return x
    flat = x.flatten(1)  # (B, slots * dim)
    factor = gain - 1 if inverse else 1 / gain - 1  # (k,)
    return (flat + ((flat @ basis.t()) * factor) @ basis).view(x.shape)


@dataclass
class Prior:
    """A trained prior: its denoiser (the averaged weights), the normalisation of z and the
    config it was trained with."""
    denoiser: Denoiser
    cfg: PriorConfig
    mean: torch.Tensor  # (slots, dim)
    std: torch.Tensor   # (slots, dim)
    basis: torch.Tensor | None = None  # (k, slots * dim): the whitened directions
    gain: torch.Tensor | None = None   # (k,): their standard deviations after mean and std

    @property
    def device(self) -> torch.device:
        return self.mean.device

    def encode(self, z: torch.Tensor) -> torch.Tensor:
        """z (B, slots, dim) -> the denoiser's coordinates."""
        return whiten((z - self.mean) / self.std, self.basis, self.gain)

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """The denoiser's coordinates (B, slots, dim) -> z."""
        return whiten(x, self.basis, self.gain, inverse=True) * self.std + self.mean

    def sample(self, n: int, steps: int | None = None, sampler: str = "dpmsolver++",
               generator: torch.Generator | None = None) -> torch.Tensor:
        """n latents z (n, slots, dim) by `steps` denoiser evaluations (default sample_steps)."""
        self.denoiser.eval()
        x = sample_with(self.denoiser, self.cfg, (n, self.denoiser.slots, self.denoiser.dim),
                        steps or self.cfg.sample_steps, sampler, self.device, generator)
        return self.decode(x)


def load_prior(folder: str | Path, device: torch.device | str = "cpu") -> Prior:
    """The finished prior in `folder` (the train stage's data/checkpoints/prior)."""
    path = Path(folder) / PRIOR_FILE if Path(folder).is_dir() else Path(folder)
    if not path.is_file():
        raise ParamsError(f"{path}: no trained prior there (it is trained by the train stage "
                          "when prior.enabled and a latent model is trained)")
    saved = torch.load(path, map_location="cpu", weights_only=False)
    if saved["step"] < saved["steps"]:
        raise ParamsError(f"{path}: the prior's training stopped at step {saved['step']} of "
                          f"{saved['steps']}; rerun the train stage to finish it")
    cfg = from_mapping(PriorConfig, saved["prior_cfg"], f"{path}: prior_cfg")
    slots, dim = saved["mean"].shape
    denoiser = Denoiser(slots, dim, cfg, gaussian_skip(cfg))
    denoiser.load_state_dict(saved["ema"] if saved.get("ema") is not None else saved["model"])
    basis, gain = (None if saved.get(k) is None else saved[k].to(device) for k in ("basis", "gain"))
    return Prior(denoiser.to(device).eval(), cfg, saved["mean"].to(device),
                 saved["std"].to(device), basis, gain)


def latents(model: LTM, how: Literal["prior", "gaussian", "prompt"], n: int,
            prior: Prior | None = None, steps: int | None = None, sampler: str = "dpmsolver++",
            scale: float = 1.0, prompts: list[list[int]] | None = None, fit_steps: int = 16,
            generator: torch.Generator | None = None) -> torch.Tensor:
    """z (n, n_layers * n_latent, d_model) for generation, in the model's dtype, three ways:
    "prior" (samples of the learned prior), "gaussian" (scale * N(0, I), the training prior) or
    "prompt" (a sample of the posterior fitted to each of the n token lists `prompts` by fit_steps
    inner steps, ltm.generate.prompt_latents)."""
    weight = model.embed.weight
    if model.cfg.n_latent == 0:
        raise ParamsError("latents: the model is plain (model.n_latent 0)")
    shape = (n, model.cfg.n_layers * model.cfg.n_latent, model.cfg.d_model)
    if how == "prior":
        if prior is None:
            raise ParamsError("latents: 'prior' needs a trained prior")
        if (prior.denoiser.slots, prior.denoiser.dim) != shape[1:]:
            raise ParamsError(f"latents: the prior is of z {(prior.denoiser.slots, prior.denoiser.dim)}"
                              f", the model's z is {shape[1:]}: trained for another model")
        z = prior.sample(n, steps, sampler, generator)
    elif how == "gaussian":
        z = scale * torch.randn(shape, generator=generator)
    elif how == "prompt":
        if prompts is None or len(prompts) != n:
            raise ParamsError(f"latents: 'prompt' needs {n} prompts")
        z = prompt_latents(model, prompts, scale, fit_steps)
    else:
        raise ParamsError(f"latents: expected prior, gaussian or prompt, got {how!r}")
    return z.to(device=weight.device, dtype=weight.dtype)


def prompt_latents(model: LTM, ids: list[list[int]], scale: float, fit_steps: int,
                   latent: LatentConfig | None = None) -> torch.Tensor | None:
    """z (B, n_layers * n_latent, d_model) for generation, None for a plain model: scale * N(0, I),
    or with fit_steps > 0 a sample of the posterior fitted to each prompt (its tokens predicting
    their successors) by fit_steps inner steps of `latent` (the checkpoint's train.latent: its
    start, optimiser and step sizes; None = the defaults)."""
    if model.cfg.n_latent == 0:
        return None
    device = model.embed.weight.device
    if fit_steps <= 0:
        return scale * torch.randn(latent_shape(model.cfg, len(ids)), device=device)
    rows = []
    fitter = decoder_fitter(model, replace(latent or LatentConfig(), steps=fit_steps))
    for row in ids:  # prompts differ in length: one posterior each
        seq = torch.tensor(row, device=device)[None]
        if seq.shape[1] < 2:
            rows.append(scale * torch.randn(latent_shape(model.cfg, 1), device=device))
            continue
        with torch.enable_grad():
            posterior = fitter.fit((seq[:, :-1], seq[:, 1:]), latent_shape(model.cfg, 1))
        rows.append(posterior.sample().detach())
    return torch.cat(rows)


def describe_latents(model: LTM, fit_steps: int, latent: LatentConfig | None, scale: float,
                     prior_steps: int | None = None, learned_prior: bool = False) -> str:
    """Where a generation's z comes from, in one line."""
    if model.cfg.n_latent == 0:
        return "no z: a plain model"
    if learned_prior:
        return f"z sampled from the learned prior (DPM-Solver++, {prior_steps or 'its default'} evaluations)"
    if fit_steps <= 0:
        return f"z drawn from N(0, I) x {scale:g}, the training prior, not fitted to the prompt"
    latent = latent or LatentConfig()
    return (f"z fitted to the prompt: {fit_steps} inner steps ({latent.optimizer}, lr {latent.lr:g}, "
            f"start {latent.init}), one posterior sample; the checkpoint was trained with "
            f"{latent.steps} inner steps")
