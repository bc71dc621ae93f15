"""Each contender scored where it was trained: the study's worker jobs (ltm.study.contenders)
train a model and then score it on the source's held-out sequences, so the scoring runs on every
core beside the other models' training instead of after it, in one process.

What each contender contributes (suffix NLL per sequence, ltm.study.scores):
    latent             its own z fitted to the prefix ("latent") and another sequence's
                       ("shuffled"); for the first training seed also the bound by inference steps
                       (`bound_curves`) and the published-vs-honest bounds (`raw_bounds`)
    plain              "plain", and dynamic evaluation of it at each of study.dynamic_lrs (the
                       best one is "dynamic")
    shared             "shared": the one learned z
    plain_equal_flops  "plain_equal_flops"
"""
from __future__ import annotations

import dataclasses

import numpy as np
from torch import nn

from ltm.latent.posterior import LatentConfig
from ltm.model.lm import LTM
from ltm.study.scores import (bound_curve, dynamic_suffix_nll, own_and_shuffled_suffix_nll,
                              prefix_posterior_sample, published_and_honest_bounds, suffix_nll,
                              with_init)
from ltm.study.settings import StudyConfig
from ltm.study.sources import StudySource


@dataclasses.dataclass
class Scored:
    """One contender's scores: suffix NLL per sequence (N,) under each name it provides; the
    dynamic evaluation's choice (plain only); the curves and raw bounds (first seed's latent)."""

    scores: dict[str, np.ndarray]
    dynamic: dict | None = None
    curves: list[dict] | None = None
    bounds: dict[str, np.ndarray] | None = None


def latent_config(cfg: StudyConfig) -> LatentConfig:
    """The latent model's inference: encoder start, cfg.inner_steps refining steps from the first
    of cfg.inner_lrs (a job's configuration lists the one step size it trains with)."""
    return LatentConfig(steps=cfg.inner_steps, init="encoder", encoder_layers=cfg.encoder_layers,
                        lr=cfg.inner_lrs[0])


def bound_curves(model: LTM, source: StudySource, cfg: StudyConfig) -> list[dict]:
    """The bound by inference steps on the first curve_sequences: the encoder's start, and the
    cold starts (the authors' and the prior)."""
    x, y = source.val_x[:cfg.curve_sequences], source.val_y[:cfg.curve_sequences]
    latent = latent_config(cfg)
    encoder_steps = sorted(set(cfg.encoder_curve) | {cfg.inner_steps})
    rows = bound_curve(model, latent, x, y, encoder_steps, cfg.seed)
    for init in ("authors", "prior"):
        rows += bound_curve(model, with_init(latent, init), x, y, sorted(cfg.cold_curve), cfg.seed)
    return rows


def raw_bounds(model: LTM, source: StudySource, cfg: StudyConfig) -> dict[str, np.ndarray]:
    """published_and_honest_bounds on the curve's sequences, per sequence."""
    x, y = source.val_x[:cfg.curve_sequences], source.val_y[:cfg.curve_sequences]
    bounds = published_and_honest_bounds(model, latent_config(cfg), x, y, cfg.inner_steps, cfg.seed)
    return {k: v.numpy() for k, v in bounds.items()}


def _dynamic(model: LTM, source: StudySource, cfg: StudyConfig) -> tuple[np.ndarray, dict]:
    """Dynamic evaluation at each step size; the best one's scores and what was chosen."""
    x, y, p = source.val_x, source.val_y, source.prefix_len
    runs = {lr: dynamic_suffix_nll(model, x, y, p, cfg.inner_steps, lr) for lr in cfg.dynamic_lrs}
    best = min(runs, key=lambda lr: float(runs[lr].mean()))
    return runs[best].numpy(), {"lr": best, "steps": cfg.inner_steps,
                                "by_lr": {str(lr): float(v.mean()) for lr, v in runs.items()}}


def score_contender(name: str, module: nn.Module, source: StudySource, cfg: StudyConfig,
                    first_seed: bool) -> Scored:
    """The scores `name` contributes (see the module docstring); module as it trained (a
    LossModel, or SharedLatents for "shared"), in eval mode."""
    x, y, p = source.val_x, source.val_y, source.prefix_len
    if name == "shared":
        return Scored({"shared": suffix_nll(module.model, x, y, p,
                                            lambda xb, yb: module.latents(len(xb))).numpy()})
    model = module.model
    if name == "latent":
        fitted = prefix_posterior_sample(model, latent_config(cfg), p, cfg.inner_steps, cfg.seed)
        own, shuffled = own_and_shuffled_suffix_nll(model, x, y, p, fitted)
        out = Scored({"latent": own.numpy(), "shuffled": shuffled.numpy()})
        if first_seed:
            out.curves, out.bounds = bound_curves(model, source, cfg), raw_bounds(model, source, cfg)
        return out
    out = Scored({name: suffix_nll(model, x, y, p).numpy()})
    if name == "plain" and cfg.inner_steps > 0:
        out.scores["dynamic"], out.dynamic = _dynamic(model, source, cfg)
    return out
