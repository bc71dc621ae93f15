"""The learned prior over latent thoughts against its baselines, on the device that runs it.

    rows, summary = bench_prior(PriorBench(), "data/checkpoints", device)

Sources of z (each `samples` draws): the prior sampled by 1000-step ancestral DDPM (the baseline)
and by DPM-Solver++ at each of eval_steps evaluations; z ~ N(0, I) at each of `scales` (the
training prior, shrunk by hand as the LTM authors do); N(mean, std) fit, the training
posteriors' per-dimension Gaussian; rank-k + diagonal fit, the prior's own normalisation alone
(what its untrained denoiser samples; prior.whiten_rank > 0); the posteriors of held-out and of
training sequences (the target itself: what a perfect prior reaches at this sample size; the
prior learns the training split's, which may sit apart from the held-out one). Beside them, the
plain LM's unconditional samples and the held-out text itself, for the text metrics.

Per source: sampling time per z and per generated sequence (z, then `new_tokens` tokens by the
static decoder); two distances to the held-out posterior samples, in the prior's normalised
coordinates ((z - mean) / std per dimension over the training posteriors):

  mmd2    (the headline) the unbiased estimate (U-statistic) of the squared maximum mean
          discrepancy over the flattened z with the Gaussian kernel exp(-|x - y|^2 / (2 h^2)), h
          the median distance between held-out samples (fixed for every source); noise: its
          jackknife standard error over both sets. Unbiased: 0 in expectation for the same
          distribution, so it may come out negative;
  fd_pca  the Frechet distance between Gaussians fitted to both sets after projecting them on the
          top pca_dims principal axes of the held-out samples (the full 1024-dimensional
          covariance is rank-deficient at a few hundred samples and its estimate is dominated by
          bias); noise: its jackknife standard error over both sets. Blind outside that
          subspace: an isotropic N(0, I) can look close on it while far off in the rest;

and the text generated from those z: its perplexity under the train stage's plain LM (exp of the
mean NLL of the generated tokens; noise: the standard error of the NLL over sequences) and its
token entropy (per sequence, the entropy in nats of its tokens' frequencies; low = repetition).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ltm.bench.timing import device_sync, host_ms
from ltm.params import check
from ltm.latent.prior import MODELS_FILE, POSTERIOR_FILE, PRIOR_DIR, load_prior
from ltm.model.decoding import Decoder, Sampling
from ltm.train.checkpoint import load_model


@dataclass
class PriorBench:
    """`prior.bench`: samplers of the learned prior against N(0, I) and the plain LM (run by the
    train stage right after the prior trains, ltm.stages.prior)."""
    enabled: bool = True
    eval_steps: list[int] = field(default_factory=lambda: [5, 10, 20, 50])  # DPM-Solver++
    baseline_steps: int = 1000  # ancestral DDPM: every step of the training schedule
    samples: int = 64           # z per source, and sequences generated from them
    new_tokens: int = 64
    temperature: float = 1.0    # sampling the text (1 = the model's own distribution)
    top_k: int | None = None
    scales: list[float] = field(default_factory=lambda: [0.5, 1.0])  # z ~ scale * N(0, I)
    pca_dims: int = 16
    repeats: int = 3            # timed runs of the fast samplers (median); the baseline: one
    seed: int = 0

    def __post_init__(self) -> None:
        check(all(s >= 1 for s in self.eval_steps), "eval_steps",
              f"must all be >= 1, got {self.eval_steps}")
        for name in ("baseline_steps", "new_tokens", "pca_dims", "repeats"):
            check(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        check(self.samples >= 4, "samples", f"must be >= 4 (the estimators), got {self.samples}")
        check(self.temperature > 0, "temperature", f"must be > 0, got {self.temperature}")
        check(self.top_k is None or self.top_k >= 1, "top_k", f"must be >= 1, got {self.top_k}")
        check(all(s > 0 for s in self.scales), "scales", f"must all be > 0, got {self.scales}")


# ---------------------------------------------------------------------------------------------
# Distances between two samples x (n, d), y (m, d), float64, with jackknife standard errors.


def _jackknife_se(leave_one_out: torch.Tensor) -> float:
    """Standard error from n leave-one-out values of a statistic: sqrt((n-1)/n sum (t_i - t.)^2)."""
    n = len(leave_one_out)
    return math.sqrt((n - 1) / n * float((leave_one_out - leave_one_out.mean()).square().sum()))


def _sqrt_psd(a: torch.Tensor) -> torch.Tensor:
    values, vectors = torch.linalg.eigh(a)
    return vectors @ torch.diag_embed(values.clamp(min=0).sqrt()) @ vectors.transpose(-1, -2)


def frechet_from_stats(mu1: torch.Tensor, cov1: torch.Tensor, mu2: torch.Tensor,
                       cov2: torch.Tensor) -> torch.Tensor:
    """|mu1 - mu2|^2 + tr(S1 + S2 - 2 (S1^1/2 S2 S1^1/2)^1/2), batched over leading dims: the
    squared 2-Wasserstein distance between N(mu1, S1) and N(mu2, S2)."""
    root = _sqrt_psd(cov1)
    middle = torch.linalg.eigvalsh(root @ cov2 @ root).clamp(min=0).sqrt().sum(-1)
    trace = torch.diagonal(cov1, dim1=-2, dim2=-1).sum(-1) + torch.diagonal(cov2, dim1=-2, dim2=-1).sum(-1)
    return (mu1 - mu2).square().sum(-1) + trace - 2 * middle


def _moments_loo(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Leave-one-out means (n, d) and sample covariances (n, d, d) of x (n, d)."""
    n = len(x)
    means = (x.sum(0) - x) / (n - 1)
    second = x.T @ x - x[:, :, None] * x[:, None, :]  # (n, d, d): sum over j != i of x_j x_j^T
    covs = (second - (n - 1) * means[:, :, None] * means[:, None, :]) / (n - 2)
    return means, covs


def frechet(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Frechet distance between Gaussians fitted to x (n, d) and y (m, d), and its jackknife
    standard error (leaving out one row of x, then of y)."""
    x, y = x.double(), y.double()
    value = frechet_from_stats(x.mean(0), torch.cov(x.T), y.mean(0), torch.cov(y.T))
    mx, sx = _moments_loo(x)
    my, sy = _moments_loo(y)
    loo_x = frechet_from_stats(mx, sx, y.mean(0).expand_as(mx), torch.cov(y.T).expand_as(sx))
    loo_y = frechet_from_stats(x.mean(0).expand_as(my), torch.cov(x.T).expand_as(sy), my, sy)
    return float(value), math.hypot(_jackknife_se(loo_x), _jackknife_se(loo_y))


def pca_basis(reference: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean (d,), the top-k principal axes (d, k)) of reference (n, d)."""
    reference = reference.double()
    mean = reference.mean(0)
    _, _, vh = torch.linalg.svd(reference - mean, full_matrices=False)
    return mean, vh[:k].T


def median_bandwidth(x: torch.Tensor) -> float:
    """The median distance between distinct rows of x (n, d)."""
    d = torch.cdist(x.double(), x.double())
    return float(d[torch.triu(torch.ones_like(d, dtype=torch.bool), 1)].median())


def mmd2(x: torch.Tensor, y: torch.Tensor, bandwidth: float) -> tuple[float, float]:
    """Unbiased MMD^2 between x (n, d) and y (m, d) with a Gaussian kernel of `bandwidth`, and its
    jackknife standard error; each leave-one-out value in closed form from kernel row sums."""
    x, y = x.double(), y.double()
    gamma = 1 / (2 * bandwidth ** 2)
    kxx, kyy = torch.exp(-gamma * torch.cdist(x, x).square()), torch.exp(-gamma * torch.cdist(y, y).square())
    kxy = torch.exp(-gamma * torch.cdist(x, y).square())
    n, m = len(x), len(y)
    rx, ry = kxx.sum(1) - kxx.diagonal(), kyy.sum(1) - kyy.diagonal()  # off-diagonal row sums
    sxx, syy, sxy = rx.sum(), ry.sum(), kxy.sum()
    value = sxx / (n * (n - 1)) + syy / (m * (m - 1)) - 2 * sxy / (n * m)
    loo_x = ((sxx - 2 * rx) / ((n - 1) * (n - 2)) + syy / (m * (m - 1))
             - 2 * (sxy - kxy.sum(1)) / ((n - 1) * m))
    loo_y = (sxx / (n * (n - 1)) + (syy - 2 * ry) / ((m - 1) * (m - 2))
             - 2 * (sxy - kxy.sum(0)) / (n * (m - 1)))
    return float(value), math.hypot(_jackknife_se(loo_x), _jackknife_se(loo_y))


# ---------------------------------------------------------------------------------------------
# Text metrics


@torch.no_grad()
def generative_nll(model, bos: int, tokens: torch.Tensor) -> torch.Tensor:
    """Mean NLL per sequence (N,) of generated tokens (N, T) under `model`, each sequence
    preceded by the end-of-text token it was generated after."""
    seq = torch.cat([torch.full_like(tokens[:, :1], bos), tokens], 1).to(model.embed.weight.device)
    logits, _ = model(seq[:, :-1])
    nll = F.cross_entropy(logits.flatten(0, 1).float(), seq[:, 1:].flatten(), reduction="none")
    return nll.view(len(seq), -1).mean(1).cpu()


def token_entropy(tokens: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of each row's token frequencies (N,), tokens (N, T)."""
    out = []
    for row in tokens:
        p = torch.bincount(row).double()
        p = p[p > 0] / len(row)
        out.append(-(p * p.log()).sum())
    return torch.stack(out)


def _standard_error(values: torch.Tensor) -> float:
    return float(values.double().std() / math.sqrt(len(values)))


def _median_seconds(fn, device: torch.device, repeats: int):
    """(result of the last call, median seconds over `repeats` calls, none untimed)."""
    last = {}

    def call() -> None:
        last["out"] = fn()
    ms = host_ms(call, repeats, warmup=0, sync=device_sync(device))
    return last["out"], ms / 1e3


# ---------------------------------------------------------------------------------------------
# The benchmark


@dataclass
class _Setup:
    """What every source is measured against."""
    reference: torch.Tensor  # held-out posterior samples, normalised and flattened (n, d)
    axes: tuple[torch.Tensor, torch.Tensor]  # PCA of the reference: mean, axes
    bandwidth: float
    mean: torch.Tensor  # the prior's normalisation (slots, dim)
    std: torch.Tensor


def _draws(post: dict, split: str, rows: slice, seed: int) -> torch.Tensor:
    """One z ~ q per posterior of `split` (rows), seeded."""
    mu, log_var = post[f"{split}_mu"][rows], post[f"{split}_log_var"][rows]
    eps = torch.randn(mu.shape, generator=torch.Generator().manual_seed(seed))
    return mu + torch.exp(0.5 * log_var) * eps


def _distances(z: torch.Tensor, setup: _Setup) -> dict:
    flat = ((z.cpu() - setup.mean) / setup.std).flatten(1)
    mean, axes = setup.axes
    fd, fd_se = frechet((flat.double() - mean) @ axes, (setup.reference - mean) @ axes)
    mmd, mmd_se = mmd2(flat, setup.reference, setup.bandwidth)
    return {"fd_pca": fd, "fd_pca_noise": fd_se, "mmd2": mmd, "mmd2_noise": mmd_se}


def _text(cfg: PriorBench, model, plain, bos: int, z, device) -> tuple[dict, torch.Tensor, float]:
    """(text metrics, tokens (N, new_tokens), seconds of the generation) from `model` with z.
    The static decoder is built (on a GPU: its CUDA graph captured) before the clock starts."""
    torch.manual_seed(cfg.seed)
    decoder = Decoder(model, cfg.samples, cfg.new_tokens, Sampling(cfg.temperature, cfg.top_k), z)
    prompts = [torch.tensor([bos])] * cfg.samples
    tokens, seconds = _median_seconds(lambda: decoder.generate(prompts, cfg.new_tokens), device, 1)
    return _text_metrics(plain, bos, tokens.cpu()), tokens.cpu(), seconds


def _text_metrics(plain, bos: int, tokens: torch.Tensor) -> dict:
    nll, entropy = generative_nll(plain, bos, tokens), token_entropy(tokens)
    return {"gen_ppl": math.exp(float(nll.mean())), "gen_nll": float(nll.mean()),
            "gen_nll_noise": _standard_error(nll), "token_entropy": float(entropy.mean()),
            "token_entropy_noise": _standard_error(entropy)}


def _z_sources(cfg: PriorBench, prior, post: dict, n_ref: int) -> list[tuple[dict, object, int]]:
    """(row head, a function drawing z, timed repeats) per source of z."""
    n, shape = cfg.samples, (cfg.samples, prior.denoiser.slots, prior.denoiser.dim)

    def prior_z(steps: int, sampler: str):
        return lambda: prior.sample(n, steps, sampler, torch.Generator().manual_seed(cfg.seed))

    sources = [({"source": "prior", "sampler": "DDPM (ancestral)",
                 "evaluations": cfg.baseline_steps}, prior_z(cfg.baseline_steps, "ddpm"), 1)]
    sources += [({"source": "prior", "sampler": "DPM-Solver++", "evaluations": s},
                 prior_z(s, "dpmsolver++"), cfg.repeats) for s in cfg.eval_steps]
    for scale in cfg.scales:
        sources.append(({"source": f"N(0, I) x{scale:g}", "sampler": "gaussian", "evaluations": 0},
                        lambda scale=scale: scale * torch.randn(
                            shape, generator=torch.Generator().manual_seed(cfg.seed)), cfg.repeats))
    # the training posteriors' per-dimension Gaussian, N(mean, std^2): what the prior's
    # normalisation alone gives (a denoiser that predicts no noise samples exactly this), so the
    # prior's network earns only what it adds to this row
    sources.append(({"source": DIAGONAL_FIT, "sampler": "gaussian fit", "evaluations": 0},
                    lambda: prior.mean.cpu() + prior.std.cpu() * torch.randn(
                        shape, generator=torch.Generator().manual_seed(cfg.seed)), cfg.repeats))
    if prior.basis is not None:  # the prior's own normalisation: a low-rank + diagonal fit
        sources.append(({"source": LOW_RANK_FIT.format(rank=len(prior.basis)),
                         "sampler": "gaussian fit", "evaluations": 0},
                        lambda: prior.decode(torch.randn(shape, generator=torch.Generator(
                            ).manual_seed(cfg.seed)).to(prior.device)).cpu(), cfg.repeats))
    sources.append(({"source": "posterior (held-out)", "sampler": "fitted", "evaluations": None},
                    lambda: _draws(post, "heldout", slice(0, n), cfg.seed), 1))
    sources.append(({"source": "posterior (train split)", "sampler": "fitted",
                     "evaluations": None},
                    lambda: _draws(post, "train", slice(0, n), cfg.seed), 1))
    return sources


def bench_prior(cfg: PriorBench, checkpoint_dir: str | Path, device: torch.device
                ) -> tuple[list[dict], dict]:
    """Rows (one per source) and a summary; ([], {"skipped": why}) without a trained prior."""
    folder = Path(checkpoint_dir) / PRIOR_DIR
    if not cfg.enabled:
        return [], {"skipped": "prior.bench.enabled is false"}
    if not (folder / MODELS_FILE).is_file():
        return [], {"skipped": f"no trained prior in {folder} (prior.enabled false, or the "
                               "train stage trained no latent model)"}
    models = json.loads((folder / MODELS_FILE).read_text())
    if models["plain"] is None:
        return [], {"skipped": "no plain model to score the text (train.counterpart.enabled false)"}
    prior = load_prior(folder, device)
    post = torch.load(folder / POSTERIOR_FILE, map_location="cpu", weights_only=False)
    n_ref = len(post["heldout_mu"]) - cfg.samples
    if n_ref < 4:
        raise ValueError(f"prior.bench.samples: {cfg.samples} needs more than that many held-out "
                         f"posteriors (prior.heldout_sequences is {len(post['heldout_mu'])})")
    latent = load_model(Path(checkpoint_dir) / models["latent"], device)
    plain = load_model(Path(checkpoint_dir) / models["plain"], device)
    reference = ((_draws(post, "heldout", slice(cfg.samples, None), cfg.seed + 1)
                  - prior.mean.cpu()) / prior.std.cpu()).flatten(1).double()
    setup = _Setup(reference, pca_basis(reference, cfg.pca_dims), median_bandwidth(reference),
                   prior.mean.cpu(), prior.std.cpu())
    for sampler in ("ddpm", "dpmsolver++"):  # untimed: first kernels, allocator, scheduler setup
        prior.sample(cfg.samples, 2, sampler)
    rows = []
    for head, draw, repeats in _z_sources(cfg, prior, post, n_ref):
        z, seconds = _median_seconds(draw, device, repeats)
        z = z.to(device=device, dtype=latent.embed.weight.dtype)
        text, _, gen_seconds = _text(cfg, latent, plain, post["bos"], z, device)
        timed = head["sampler"] != "fitted"
        rows.append({**head, "ms_per_z": 1e3 * seconds / cfg.samples if timed else None,
                     "ms_per_sequence": 1e3 * (seconds * timed + gen_seconds) / cfg.samples,
                     **_distances(z, setup), **text})
    text, _, gen_seconds = _text(cfg, plain, plain, post["bos"], None, device)
    rows.append({"source": "plain LM", "sampler": "unconditional", "evaluations": None,
                 "ms_per_sequence": 1e3 * gen_seconds / cfg.samples, **text})
    held = post["heldout_tokens"][:cfg.samples, :cfg.new_tokens]
    rows.append({"source": "held-out text", "sampler": "data", "evaluations": None,
                 **_text_metrics(plain, post["bos"], held)})
    for row in rows:
        row.update(samples=cfg.samples, reference=n_ref)
    return rows, summarise(rows, cfg, setup)


DIAGONAL_FIT = "N(mean, std) fit"
LOW_RANK_FIT = "rank-{rank} + diagonal fit"


def label(row: dict) -> str:
    """A row's name: the sampler and its evaluations for the prior, else the source."""
    if row["source"] == "prior":
        return f"prior {row['sampler'].split(' ')[0]} {row['evaluations']}"
    return row["source"]


# per-source values in the summary (benchmark's prior.json)
SUMMARY_KEYS = ("ms_per_z", "ms_per_sequence", "fd_pca", "fd_pca_noise", "mmd2", "mmd2_noise",
                "gen_ppl", "gen_nll_noise", "token_entropy")


def verdict(a: dict, b: dict, key: str) -> str:
    """a against b on `key` (mmd2, fd_pca or gen_nll: lower is better): "better" or "worse" by
    more than twice the combined noise, else "tie" (they agree within it)."""
    gap, noise = b[key] - a[key], 2 * math.hypot(a[f"{key}_noise"], b[f"{key}_noise"])
    return "better" if gap > noise else "worse" if gap < -noise else "tie"


def _verdicts(rows: list[dict], ddpm: dict) -> dict:
    """The 1000-step prior against the fits and against its ceiling, the training posteriors'
    own draws (what a perfect prior of the training split reaches at this sample size), on both
    distances; and each fit against that ceiling: a fit that ties it leaves no room to beat."""
    rivals = [r for r in rows if r["sampler"] == "gaussian fit"]
    rivals += [r for r in rows if r["source"] == "posterior (train split)"]
    out = {}
    for key in ("mmd2", "fd_pca"):
        out[key] = {f"prior vs {r['source']}": verdict(ddpm, r, key) for r in rivals}
        out[key].update({f"{r['source']} vs {rivals[-1]['source']}": verdict(r, rivals[-1], key)
                         for r in rivals[:-1]})
    return out


def summarise(rows: list[dict], cfg: PriorBench, setup: _Setup) -> dict:
    """Every source's numbers, and the issue's two questions on the headline z-distance, the
    unbiased MMD^2 (fd_pca sees only the top principal subspace of the held-out posteriors, where
    N(0, I) happens to look fine): how few DPM-Solver++ evaluations match the 1000-step sampler
    (ratios, and agreement within twice the combined noise on both the MMD^2 and the generated
    text's NLL), whether the prior beats N(0, I) at its best scale (by more than twice the
    combined noise), and whether it beats the posteriors' per-dimension Gaussian fit (the same
    test): the part of its lead that the network, not the normalisation, earns."""
    ddpm = next(r for r in rows if r["sampler"].startswith("DDPM"))
    dpm = [r for r in rows if r["sampler"] == "DPM-Solver++"]
    gaussian = min((r for r in rows if r["sampler"] == "gaussian"), key=lambda r: r["mmd2"],
                   default=None)
    out = {"samples": cfg.samples, "reference_samples": len(setup.reference),
           "pca_dims": cfg.pca_dims, "mmd_bandwidth": round(setup.bandwidth, 4),
           "by_source": {label(r): {k: r.get(k) for k in SUMMARY_KEYS} for r in rows}}
    for r in dpm:
        out[f"dpm{r['evaluations']}_mmd2_ratio_to_ddpm"] = r["mmd2"] / ddpm["mmd2"]
        out[f"dpm{r['evaluations']}_gen_ppl_ratio_to_ddpm"] = r["gen_ppl"] / ddpm["gen_ppl"]
    matching = [r["evaluations"] for r in dpm
                if verdict(r, ddpm, "mmd2") == "tie" and verdict(r, ddpm, "gen_nll") == "tie"]
    out["fewest_dpm_evaluations_matching_ddpm"] = min(matching, default=None)
    out["fewer_evaluations_x"] = ddpm["evaluations"] / min(matching) if matching else None
    fit = next((r for r in rows if r["source"] == DIAGONAL_FIT), None)
    if fit is not None:
        out["prior_mmd2_over_diagonal_fit"] = ddpm["mmd2"] / fit["mmd2"]
        out["prior_beats_diagonal_fit"] = verdict(ddpm, fit, "mmd2") == "better"
    out["verdicts"] = _verdicts(rows, ddpm)
    if gaussian is not None:
        out["best_gaussian"] = gaussian["source"]
        out["prior_mmd2_over_best_gaussian"] = ddpm["mmd2"] / gaussian["mmd2"]
        out["prior_beats_best_gaussian"] = verdict(ddpm, gaussian, "mmd2") == "better"
    return out


# the columns of the rows (the plot table's header when the benchmark is skipped)
PRIOR_COLUMNS = ["source", "sampler", "evaluations", "ms_per_z", "ms_per_sequence", "fd_pca",
                 "fd_pca_noise", "mmd2", "mmd2_noise", "gen_ppl", "gen_nll", "gen_nll_noise",
                 "token_entropy", "token_entropy_noise", "samples", "reference"]
