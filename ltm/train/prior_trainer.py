"""Training the diffusion prior over latent thoughts (ltm.latent.prior) in the train stage, after the
models: posterior samples of the training split from the trained latent model, then the denoiser,
checkpointed and resumable like the models (ltm.train.checkpoint's atomic save; a checkpoint is resumed
only by the same code, prior config and posterior samples, and a resumed run equals an
uninterrupted one: every random draw comes from one generator whose state is saved).

Posterior samples: q(z | x) = N(mu, sigma^2) is fitted to each of prior.train_sequences training
windows by the latent model's own inner loop, with the train.latent settings it was trained with
(read from its checkpoint: the CPU default's counterpart takes 1 inner step). The prior trains on
fresh draws z = mu + sigma * eps of those posteriors, i.e. on their mixture, the aggregate
posterior; prior.heldout_sequences validation windows get theirs too, for the benchmark.

    metrics = prior_stage("params.yaml", "data/checkpoints", "reports/results/prior_train.json")
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ltm.data.cache import TOKENIZER_FILE, TokenCache, cache_fingerprint
from ltm.data.tokenizer import end_of_text_id, load_tokenizer
from ltm.latent.posterior import LatentConfig, decoder_fitter, latent_shape
from ltm.latent.prior import (MODELS_FILE, POSTERIOR_FILE, PRIOR_DIR, PRIOR_FILE, Denoiser, Prior,
                              PriorConfig, gaussian_skip, make_scheduler)
from ltm.model.config import ModelConfig
from ltm.params import ParamsError, from_mapping
from ltm.train import checkpoint as ckpt
from ltm.train.checkpoint import load_model
from ltm.train.counterpart import LATENT, PLAIN, SUBFOLDERS
from ltm.train.settings import TrainConfig

# prior keys that may change between a run and its resumption: they do not change the weights
# of the steps already taken
RESUMABLE_CHANGES = ("enabled", "steps", "resume", "checkpoint_every", "sample_steps",
                     "solver_order")
# the posterior set depends on these keys only
POSTERIOR_KEYS = ("train_sequences", "heldout_sequences", "fit_batch", "seed")
# held-out denoising loss: noise draws per held-out z
EVAL_DRAWS = 4
# training loss curve in the metrics: the mean over windows of this many steps
CURVE_WINDOW = 25


def model_dirs(checkpoint_dir: str | Path, model_cfg, train_cfg) -> tuple[Path | None, Path | None]:
    """(the latent model's checkpoint folder, the plain model's) of the train stage, None where
    it trained none (ltm.train.counterpart: the configured model in checkpoint_dir, the other kind in
    its subfolder when train.counterpart.enabled)."""
    root = Path(checkpoint_dir)
    latent_main = model_cfg.n_latent > 0 and train_cfg.latent.steps > 0
    other = root / SUBFOLDERS[PLAIN if latent_main else LATENT]
    other = other if train_cfg.counterpart.enabled else None
    return (root, other) if latent_main else (other, root)


def weights_hash(state: dict) -> str:
    """sha256 of a state dict's tensors: which trained model the posteriors came from."""
    digest = hashlib.sha256()
    for key in sorted(state):
        digest.update(key.encode() + state[key].detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def fit_posteriors(model, latent_cfg, batches, generator: torch.Generator
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(mu, log_var) (N, slots, dim) of every window of `batches` ((x, y) pairs), fitted by the
    model's inner loop (latent_cfg.steps steps), on the CPU."""
    fitter, device = decoder_fitter(model, latent_cfg), model.embed.weight.device
    mus, log_vars = [], []
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        post = fitter.fit((x, y), latent_shape(model.cfg, len(x)), generator=generator)
        mus.append(post.mu.detach().cpu())
        log_vars.append(post.log_var.detach().cpu())
    return torch.cat(mus), torch.cat(log_vars)


def _windows(cache_dir: str, split: str, n: int, batch: int, seq_len: int, seed: int) -> list:
    """n windows of the split in batches: random training windows (seeded), or the validation
    split's first windows in order (those the train stage evaluates on)."""
    data = TokenCache(cache_dir, split, verify=False)
    if split == "val":
        rows = [pair for pair in data.eval_batches(batch, seq_len)]
        x, y = torch.cat([p[0] for p in rows])[:n], torch.cat([p[1] for p in rows])[:n]
        return [(x[i:i + batch], y[i:i + batch]) for i in range(0, len(x), batch)]
    generator = torch.Generator().manual_seed(seed)
    return [data.sample_batch(min(batch, n - i), seq_len, generator) for i in range(0, n, batch)]


def posterior_set(latent_dir: Path, cache_dir: str, cfg: PriorConfig, device: torch.device,
                  out: Path, say=print) -> dict:
    """The posteriors of the training and held-out windows from the latent model in latent_dir:
    read from out (posterior.pt) when they came from the same model, code, data and settings,
    else fitted and written there. Keys: train_mu, train_log_var, heldout_mu, heldout_log_var
    (N, slots, dim), train_tokens, heldout_tokens (N, seq_len), source (what they depend on), bos
    (the end-of-text id), latent_steps (the inner loop's), seconds."""
    saved = ckpt.load_checkpoint(latent_dir / ckpt.CHECKPOINT_FILE)
    latent_cfg = from_mapping(LatentConfig, saved["train_cfg"]["latent"], "train.latent")
    seq_len = saved["train_cfg"]["seq_len"]
    source = {"code": ckpt.code_fingerprint(), "model": weights_hash(saved["model"]),
              "data": cache_fingerprint(cache_dir), "seq_len": seq_len,
              **{k: getattr(cfg, k) for k in POSTERIOR_KEYS}}
    old = ckpt.load_checkpoint(out)
    if old is not None and old.get("source") == source:
        return old
    start = time.perf_counter()
    model = load_model(latent_dir, device)
    generator = torch.Generator(device).manual_seed(cfg.seed)
    result = {"source": source, "latent_steps": latent_cfg.steps,
              "bos": end_of_text_id(load_tokenizer(Path(cache_dir) / TOKENIZER_FILE))}
    for split, n in (("train", cfg.train_sequences), ("heldout", cfg.heldout_sequences)):
        windows = _windows(cache_dir, "train" if split == "train" else "val", n, cfg.fit_batch,
                           seq_len, cfg.seed)
        result[f"{split}_mu"], result[f"{split}_log_var"] = fit_posteriors(
            model, latent_cfg, windows, generator)
        # the windows' tokens: the benchmark's reference text
        result[f"{split}_tokens"] = torch.cat([x for x, _ in windows])
    result["seconds"] = time.perf_counter() - start
    say(f"prior: fitted {len(result['train_mu'])} training and {len(result['heldout_mu'])} "
        f"held-out posteriors ({latent_cfg.steps} inner steps) in {result['seconds']:.1f} s")
    ckpt.save_checkpoint(out, result)
    return result


def normalisation(mu: torch.Tensor, log_var: torch.Tensor, normalize: bool
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-dimension mean and std (slots, dim) of the mixture of the posteriors N(mu, sigma^2)
    (exact: the mixture's variance is E[mu^2 + sigma^2] - E[mu]^2), or 0 and 1."""
    if not normalize:
        return torch.zeros(mu.shape[1:]), torch.ones(mu.shape[1:])
    mean = mu.mean(0)
    var = (mu.square() + log_var.exp()).mean(0) - mean.square()
    return mean, var.clamp(min=1e-12).sqrt()


def principal_whitening(mu: torch.Tensor, log_var: torch.Tensor, mean: torch.Tensor,
                        std: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top `rank` principal directions (rank, slots * dim), orthonormal, of the posterior
    means (N, slots, dim) after the per-dimension normalisation, and their standard deviations
    (rank,) under the posteriors' mixture (the means' spread plus the mean sigma^2 along each).
    From the N x N Gram matrix: N posteriors are far fewer than slots * dim numbers."""
    n = len(mu)
    if rank >= n:
        raise ParamsError(f"prior.whiten_rank: must be below the {n} training posteriors "
                          f"(prior.train_sequences), got {rank}")
    centred = ((mu - mean) / std).flatten(1).double()  # (N, d)
    gram_values, gram_vectors = torch.linalg.eigh(centred @ centred.t() / n)  # ascending
    # the largest first: (rank,), (N, rank)
    values, vectors = gram_values.flip(0)[:rank], gram_vectors.flip(1)[:, :rank]
    basis = (centred.t() @ vectors / (n * values.clamp(min=1e-12)).sqrt()).t()  # (rank, d)
    basis = basis / basis.norm(dim=1, keepdim=True)
    spread = (log_var.exp() / std.square()).flatten(1).double().mean(0)  # (d,) mean sigma^2
    gain = (values + basis.square() @ spread).clamp(min=1e-12).sqrt()
    return basis.float(), gain.float()


def denoising_loss(denoiser: Denoiser, scheduler, cfg: PriorConfig, x0: torch.Tensor,
                   noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Mean squared error of the denoiser's prediction (eps or v) of x_t, (B, slots, dim) each."""
    x_t = scheduler.add_noise(x0, noise, t)
    target = noise if cfg.prediction_type == "epsilon" else scheduler.get_velocity(x0, noise, t)
    return F.mse_loss(denoiser(x_t, t), target)


class PriorTrainer:
    """One training run of the denoiser on posteriors (mu, log_var) (N, slots, dim); checkpoints
    in `folder` (None: none)."""

    def __init__(self, cfg: PriorConfig, mu: torch.Tensor, log_var: torch.Tensor,
                 folder: Path | None, device: torch.device | str = "cpu", say=print) -> None:
        self.cfg, self.device, self.say = cfg, torch.device(device), say
        self.mu, self.sigma = mu.to(self.device), torch.exp(0.5 * log_var).to(self.device)
        mean, std = normalisation(mu, log_var, cfg.normalize)
        basis, gain = (principal_whitening(mu, log_var, mean, std, cfg.whiten_rank)
                       if cfg.whiten_rank else (None, None))
        # the normalisation of z, as the finished Prior carries it (its denoiser comes in run)
        self.normaliser = Prior(None, cfg, *(None if v is None else v.to(self.device)
                                             for v in (mean, std, basis, gain)))
        self.path = None if folder is None else Path(folder) / PRIOR_FILE
        self.scheduler = make_scheduler(cfg, "ddpm")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            self.model = Denoiser(mu.shape[1], mu.shape[2], cfg, gaussian_skip(cfg)).to(self.device)
        self.ema = copy.deepcopy(self.model).requires_grad_(False) if cfg.ema > 0 else None
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr,
                                           weight_decay=cfg.weight_decay)
        self.generator = torch.Generator().manual_seed(cfg.seed + 1)
        self.step, self.losses = 0, []
        data = hashlib.sha256(mu.numpy().tobytes() + log_var.numpy().tobytes()).hexdigest()
        self.fingerprint = {"code": ckpt.code_fingerprint(), "data": data,
                            "prior_cfg": {k: v for k, v in dataclasses.asdict(cfg).items()
                                          if k not in RESUMABLE_CHANGES}}

    def try_resume(self) -> str:
        """Load the checkpoint when it matches; what was done, in words."""
        saved = ckpt.load_checkpoint(self.path) if self.path is not None and self.cfg.resume else None
        if saved is None:
            return "started"
        if saved.get("fingerprint") != self.fingerprint or saved["step"] > self.cfg.steps:
            why = ("it is past prior.steps" if saved.get("fingerprint") == self.fingerprint else
                   "its code, prior config or posterior samples differ")
            self.say(f"prior: not resuming from {self.path}: {why}; starting fresh")
            return "started: the checkpoint did not match"
        self.model.load_state_dict(saved["model"])
        if self.ema is not None:
            self.ema.load_state_dict(saved["ema"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.generator.set_state(saved["generator"])
        self.step, self.losses = saved["step"], list(saved["losses"])
        return f"resumed at step {self.step}"

    def save(self, metrics: dict | None = None) -> None:
        if self.path is None:
            return
        if not ckpt.all_finite(self.model.state_dict()):
            raise FloatingPointError(f"prior: the denoiser's weights are not finite after step "
                                     f"{self.step}: lower prior.lr")
        ckpt.save_checkpoint(self.path, {
            "step": self.step, "steps": self.cfg.steps, "model": self.model.state_dict(),
            "ema": None if self.ema is None else self.ema.state_dict(),
            "optimizer": self.optimizer.state_dict(), "generator": self.generator.get_state(),
            "losses": self.losses,
            **{k: None if getattr(self.normaliser, k) is None else getattr(self.normaliser, k).cpu()
               for k in ("mean", "std", "basis", "gain")},
            "prior_cfg": dataclasses.asdict(self.cfg), "fingerprint": self.fingerprint,
            "metrics": metrics})

    def batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(x0, noise, t) of one step: normalised draws z ~ q of random training posteriors,
        all random numbers from the run's generator on the CPU."""
        n, shape = len(self.mu), (self.cfg.batch_size, *self.mu.shape[1:])
        rows = torch.randint(n, (self.cfg.batch_size,), generator=self.generator)
        eps = torch.randn(shape, generator=self.generator)
        noise = torch.randn(shape, generator=self.generator)
        t = torch.randint(self.cfg.train_timesteps, (self.cfg.batch_size,), generator=self.generator)
        rows, eps, noise, t = (v.to(self.device) for v in (rows, eps, noise, t))
        z = self.mu[rows] + self.sigma[rows] * eps
        return self.normaliser.encode(z), noise, t

    def train_step(self) -> float:
        cfg = self.cfg
        lr = cfg.lr * min(1.0, (self.step + 1) / cfg.warmup_steps) if cfg.warmup_steps else cfg.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss = denoising_loss(self.model, self.scheduler, cfg, *self.batch())
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            with torch.no_grad():
                torch._foreach_lerp_(list(self.ema.parameters()), list(self.model.parameters()),
                                     1 - cfg.ema)
        self.step += 1
        return loss.item()

    def run(self) -> Prior:
        """Train to cfg.steps from the checkpoint or the start; the prior (averaged weights)."""
        while self.step < self.cfg.steps:
            self.losses.append(self.train_step())
            every = self.cfg.checkpoint_every
            if every and self.step % every == 0 and self.step < self.cfg.steps:
                self.save()
        sampled = self.ema if self.ema is not None else self.model
        return dataclasses.replace(self.normaliser, denoiser=sampled.eval())


@torch.no_grad()
def eval_loss(prior: Prior, mu: torch.Tensor, log_var: torch.Tensor, seed: int) -> float:
    """The denoising loss of `prior` on one draw z ~ q of each posterior, EVAL_DRAWS noise draws
    and timesteps each, all seeded: comparable between the training and held-out posteriors."""
    generator = torch.Generator().manual_seed(seed)
    eps = torch.randn(mu.shape, generator=generator)
    z = mu + torch.exp(0.5 * log_var) * eps
    x0 = prior.encode(z.to(prior.device)).repeat(EVAL_DRAWS, 1, 1)
    noise = torch.randn(x0.shape, generator=generator).to(prior.device)
    t = torch.randint(prior.cfg.train_timesteps, (len(x0),), generator=generator).to(prior.device)
    scheduler = make_scheduler(prior.cfg, "ddpm")
    return float(denoising_loss(prior.denoiser.eval(), scheduler, prior.cfg, x0, noise, t))


def train_prior(cfg: PriorConfig, posteriors: dict, folder: Path | None,
                device: torch.device | str = "cpu", say=print) -> tuple[Prior, dict]:
    """Train (or resume) the prior on posteriors' train_mu / train_log_var; its metrics."""
    start = time.perf_counter()
    trainer = PriorTrainer(cfg, posteriors["train_mu"], posteriors["train_log_var"], folder,
                           device, say)
    done = trainer.try_resume()
    prior = trainer.run()
    losses = trainer.losses
    n_heldout = len(posteriors["heldout_mu"])
    metrics = {
        "run": done, "steps": trainer.step, "batch_size": cfg.batch_size,
        "params": sum(p.numel() for p in trainer.model.parameters()),
        "slots": trainer.model.slots, "dim": trainer.model.dim,
        "train_loss_first": sum(losses[:CURVE_WINDOW]) / len(losses[:CURVE_WINDOW]),
        "train_loss_last": sum(losses[-CURVE_WINDOW:]) / len(losses[-CURVE_WINDOW:]),
        # the same loss on as many training as held-out posteriors: a gap means memorised z
        "eval_loss_train": eval_loss(prior, posteriors["train_mu"][:n_heldout],
                                     posteriors["train_log_var"][:n_heldout], cfg.seed + 2),
        "eval_loss_heldout": eval_loss(prior, posteriors["heldout_mu"],
                                       posteriors["heldout_log_var"], cfg.seed + 2),
        "curve": [{"step": i + CURVE_WINDOW, "loss": sum(losses[i:i + CURVE_WINDOW]) / CURVE_WINDOW}
                  for i in range(0, len(losses) - CURVE_WINDOW + 1, CURVE_WINDOW)],
        "seconds_this_run": time.perf_counter() - start}
    trainer.save(metrics)
    return prior, metrics


def _skip(metrics_path: Path, why: str, say) -> dict:
    say(f"prior: skipped: {why}")
    metrics = {"enabled": False, "skipped": why}
    metrics_path.write_text(json.dumps(metrics, indent=1) + "\n")
    return metrics


def train_stage_prior(cfg: PriorConfig, model_cfg: ModelConfig, train_cfg: TrainConfig, cache_dir: str,
                      checkpoint_dir: str | Path, metrics_path: str | Path, say=print) -> dict:
    """The prior of `cfg` for the latent model the train stage trained (model_cfg, train_cfg), in
    checkpoint_dir/prior; its metrics to metrics_path (also when it is skipped: a stage output)."""
    metrics_path = Path(metrics_path)
    metrics_path.parent.mkdir(parents=True, exist_ok=True)
    if not cfg.enabled:
        return _skip(metrics_path, "prior.enabled is false", say)
    latent_dir, plain_dir = model_dirs(checkpoint_dir, model_cfg, train_cfg)
    if latent_dir is None or not (latent_dir / ckpt.CHECKPOINT_FILE).is_file():
        return _skip(metrics_path, "the train stage trained no latent model (model.n_latent 0 "
                     "and train.counterpart.enabled false)", say)
    want = train_cfg.device
    device = torch.device("cuda" if want == "auto" and torch.cuda.is_available() else
                          "cpu" if want == "auto" else want)
    folder = Path(checkpoint_dir) / PRIOR_DIR
    start = time.perf_counter()
    posteriors = posterior_set(latent_dir, cache_dir, cfg, device, folder / POSTERIOR_FILE, say)
    prior, metrics = train_prior(cfg, posteriors, folder, device, say)
    root = Path(checkpoint_dir)
    models = {"latent": str(latent_dir.relative_to(root)),
              "plain": None if plain_dir is None else str(plain_dir.relative_to(root))}
    (folder / MODELS_FILE).write_text(json.dumps(models) + "\n")
    metrics = {"enabled": True, "device": str(device),
               "latent_model": models["latent"], "plain_model": models["plain"],
               "posterior_inner_steps": posteriors["latent_steps"],
               "train_sequences": len(posteriors["train_mu"]),
               "heldout_sequences": len(posteriors["heldout_mu"]),
               "posterior_seconds": round(posteriors["seconds"], 2), **metrics,
               "seconds": round(time.perf_counter() - start, 2)}
    say(f"prior: {metrics['run']}; {metrics['steps']} steps, loss {metrics['train_loss_first']:.3f}"
        f" -> {metrics['train_loss_last']:.3f} (held-out {metrics['eval_loss_heldout']:.3f}) in "
        f"{metrics['seconds']:.1f} s")
    metrics_path.write_text(json.dumps(metrics, indent=1) + "\n")
    return metrics
