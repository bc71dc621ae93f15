"""The other kind of model beside the configured one (issue 15): the train stage trains the
configured model, then its counterpart on the same data, seed and number of training tokens (the
latent model when the configured one is plain, the plain model when it is latent), then a plain
model at the latent model's training FLOPs when that fits under a cap of steps. train.json gets
a `comparison` table, one row per model, and `latent_model`, the latent model's curves by
inference steps; the loss curves of all of them go to compare_loss.csv beside the train curve.

Training FLOPs per token of a latent model: its decoder step (flops_per_token) plus each inner
step's forward and backward to the activations, no weight gradients: flops_per_token less
2 FLOPs per weight (see inner_flops_per_token), an estimate.

Each model has its own checkpoint folder, resumable like the main one: the main model in
checkpoint_dir, the counterparts in subfolders (SUBFOLDERS).
"""
from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path
import torch

from ltm.latent.posterior import LatentConfig
from ltm.model.config import ModelConfig
from ltm.train.settings import CounterpartConfig, TrainConfig, TrainResult
from ltm.model.lm import LTM
from ltm.train.trainer import run_training
from ltm.data.batches import with_vocab

# checkpoint subfolders of checkpoint_dir, and the names of the models in the comparison
LATENT, PLAIN, PLAIN_FLOPS = "latent", "plain", "plain-equal-flops"
SUBFOLDERS = {LATENT: "counterpart-latent", PLAIN: "counterpart-plain",
              PLAIN_FLOPS: "counterpart-plain-equal-flops"}


def inner_flops_per_token(flops_per_token: float, weights: int, d_model: int, vocab: int) -> float:
    """FLOPs per token of one inner step (forward, backward to the latents through every
    activation, no weight gradient): a training step's flops_per_token less the weight
    gradients' 2 FLOPs per weight (the non-embedding weights and the tied head)."""
    return flops_per_token - 2 * (weights + d_model * vocab)


def flops_of(model_cfg: ModelConfig, seq_len: int, inner_steps: int) -> float:
    """Training FLOPs per token of a model of model_cfg (vocab_size resolved) at seq_len with
    inner_steps inner steps per batch (0: plain). Built on the meta device: nothing allocated."""
    with torch.device("meta"):
        model = LTM(model_cfg)
    flops = model.flops_per_token(seq_len)
    if inner_steps and model_cfg.n_latent:
        flops += inner_steps * inner_flops_per_token(flops, model.num_params(), model_cfg.d_model,
                                                     model_cfg.vocab_size)
    return flops


def inner_passes(latent: LatentConfig) -> int:
    """Inner-step equivalents per training batch: the steps, plus one for the encoder's NELBO
    (init encoder: a forward and a backward to z through the frozen decoder; the encoder's own
    small cost left out)."""
    return latent.steps + (1 if latent.init == "encoder" and latent.steps > 0 else 0)


def _normalised(cfg: TrainConfig) -> TrainConfig:
    """cfg with train.counterpart at its defaults: a model's checkpoint does not depend on what is
    trained beside it, so changing the counterpart section resumes the main model."""
    return dataclasses.replace(cfg, counterpart=CounterpartConfig())


def _latent_train_cfg(cfg: TrainConfig, cp: CounterpartConfig) -> TrainConfig:
    latent = dataclasses.replace(
        cfg.latent, steps=cp.latent_steps if cp.latent_steps is not None else cfg.latent.steps,
        eval_steps=list(cp.eval_steps) if cp.eval_steps is not None else cfg.latent.eval_steps,
        eval_batches=cp.eval_batches if cp.eval_batches is not None else cfg.latent.eval_batches)
    return dataclasses.replace(_normalised(cfg), latent=latent)


def _row(name: str, role: str, result: TrainResult, flops_per_token: float) -> dict:
    m = result.metrics
    latent = bool(m.get("n_latent")) and bool(m.get("latent_steps"))
    tokens = m["steps"] * m["tokens_per_step"]
    return {"model": name, "role": role, "kind": "latent" if latent else "plain",
            "n_latent": m.get("n_latent", 0), "latent_steps": m.get("latent_steps", 0),
            "steps": m["steps"], "tokens": tokens,
            "training_flops": flops_per_token * tokens,
            "val_loss": m["val_loss"],
            "val_loss_is": "NELBO bound" if latent else "NLL",
            "val_prefix_nll": m.get("val_prefix_nll"), "val_prefix_ppl": m.get("val_prefix_ppl"),
            "val_prefix_nll_noise": m.get("val_prefix_nll_noise"),
            "train_loss_last10": m.get("train_loss_last10"),
            "tokens_per_s": m.get("tokens_per_s"), "seconds": m.get("seconds")}


def _skipped(name: str, role: str, why: str) -> dict:
    return {"model": name, "role": role, "kind": "plain", "skipped": why}


def _latent_summary(name: str, result: TrainResult, configured_steps: int,
                    curve_batches: int | None) -> dict:
    m = result.metrics
    steps = m.get("latent_steps", 0)
    inner = f"{steps} inner step{'' if steps == 1 else 's'} per batch"
    note = (inner if steps == configured_steps else
            f"{inner}: reduced from train.latent.steps {configured_steps} "
            "(the authors' 16 by default) by train.counterpart.latent_steps, for the time budget")
    note += ("; curves by inference steps over " + ("all validation batches" if curve_batches
             is None else f"the first {curve_batches} validation batches"))
    keys = ("n_latent", "latent_steps", "val_nelbo", "val_nll_given_fitted_z", "val_kl_per_token",
            "val_prefix_nll", "val_nelbo_by_steps", "val_nll_by_steps", "val_kl_by_steps",
            "val_prefix_nll_by_steps", "val_iwae_steps", "val_iwae_by_samples")
    return {"model": name, "note": note, **{k: m[k] for k in keys if k in m}}


def _equal_flops_counterpart(model_cfg: ModelConfig, cfg: TrainConfig, cache_dir: str, out_dir: Path,
                             progress: bool, say, runs: dict) -> tuple[dict, int | None]:
    """The plain model trained for the latent model's training FLOPs (added to `runs`), or why not
    (over train.counterpart.max_equal_flops_steps): its comparison row and its steps (None)."""
    cp = cfg.counterpart
    latent_result, latent_flops = runs[LATENT][1], runs[LATENT][2]
    plain_flops = runs[PLAIN][2]
    budget = latent_flops * latent_result.metrics["steps"] * latent_result.metrics["tokens_per_step"]
    steps = math.ceil(budget / (plain_flops * runs[PLAIN][1].metrics["tokens_per_step"]))
    role = "counterpart: equal FLOPs"
    if steps > cp.max_equal_flops_steps:
        why = (f"skipped: over the cap (needs {steps} steps for the latent model's "
               f"{budget:.3g} training FLOPs; train.counterpart.max_equal_flops_steps is "
               f"{cp.max_equal_flops_steps})")
        say(f"plain model at equal training FLOPs {why}")
        return _skipped(PLAIN_FLOPS, role, why), None
    plain_train = dataclasses.replace(_normalised(cfg), steps=steps)
    say(f"counterpart (plain, equal training FLOPs: {steps} steps) in "
        f"{out_dir / SUBFOLDERS[PLAIN_FLOPS]}")
    result = run_training(dataclasses.replace(model_cfg, n_latent=0), plain_train, cache_dir,
                          str(out_dir / SUBFOLDERS[PLAIN_FLOPS]), progress)
    runs[PLAIN_FLOPS] = (role, result, plain_flops)
    return _row(PLAIN_FLOPS, role, result, plain_flops), steps


def remove_stale_counterparts(out_dir: Path, used: set[str], say=print) -> list[Path]:
    """Delete the counterpart folders in out_dir that this configuration does not train (left by
    an earlier one: a plain run's latent counterpart after a switch to a latent model, say), so
    that no old checkpoint is taken for this run's; returns those removed."""
    removed = []
    for name, folder in SUBFOLDERS.items():
        path = Path(out_dir) / folder
        if name not in used and path.is_dir():
            shutil.rmtree(path)
            removed.append(path)
    if removed:
        say(f"removed the checkpoints of counterparts this run does not train: "
            f"{', '.join(str(p) for p in removed)}")
    return removed


def train_with_counterparts(model_cfg: ModelConfig, cfg: TrainConfig, cache_dir: str,
                            out_dir: str | Path, progress: bool = True,
                            say=print) -> TrainResult:
    """Train the configured model in out_dir, then (train.counterpart.enabled) its counterpart at
    equal training tokens and a plain model at equal training FLOPs, each in its subfolder. The
    result is the configured model's, its metrics extended by `comparison`, `latent_model` and
    `counterparts` (each counterpart's metrics), and `compared` holds every model's loss curve
    (history rows with a `model` key)."""
    cp, out_dir = cfg.counterpart, Path(out_dir)
    latent_main = model_cfg.n_latent > 0 and cfg.latent.steps > 0
    used = set() if not cp.enabled else {PLAIN if latent_main else LATENT} | (
        {PLAIN_FLOPS} if cp.equal_flops else set())
    remove_stale_counterparts(out_dir, used, say)
    main = run_training(model_cfg, _normalised(cfg), cache_dir, str(out_dir), progress)
    if not cp.enabled:
        return main
    resolved = with_vocab(model_cfg, cache_dir, "synthetic" if cfg.data == "synthetic" else "cache")
    runs: dict[str, tuple[str, TrainResult, float]] = {}
    main_name = LATENT if latent_main else PLAIN
    main_flops = flops_of(resolved, cfg.seq_len, inner_passes(cfg.latent) if latent_main else 0)
    runs[main_name] = ("configured", main, main_flops)

    if latent_main:  # the plain model at equal tokens
        other_cfg, other_train = dataclasses.replace(model_cfg, n_latent=0), _normalised(cfg)
        other_inner = other_passes = 0
    else:  # the latent model at equal tokens
        other_cfg = dataclasses.replace(model_cfg, n_latent=cp.n_latent)
        other_train = _latent_train_cfg(cfg, cp)
        other_inner = other_train.latent.steps
        other_passes = inner_passes(other_train.latent)
    other = LATENT if not latent_main else PLAIN
    say(f"counterpart ({other}, equal training tokens) in {out_dir / SUBFOLDERS[other]}"
        + (f": n_latent {cp.n_latent}, {other_inner} inner step{'' if other_inner == 1 else 's'}"
           if other == LATENT else ""))
    result = run_training(other_cfg, other_train, cache_dir, str(out_dir / SUBFOLDERS[other]),
                          progress)
    runs[other] = ("counterpart: equal tokens", result,
                   flops_of(dataclasses.replace(resolved, n_latent=other_cfg.n_latent),
                            cfg.seq_len, other_passes))

    curve_batches = (cfg.latent if latent_main else other_train.latent).eval_batches
    rows = [_row(name, role, res, flops) for name, (role, res, flops) in runs.items()]
    extra: dict = {}
    if cp.equal_flops:
        row, steps = _equal_flops_counterpart(model_cfg, cfg, cache_dir, out_dir, progress, say, runs)
        rows.append(row)
        if steps is not None:
            extra["equal_flops_steps"] = steps

    compared = [dict(r, model=name) for name, (_, res, _) in runs.items() for r in res.history]
    metrics = dict(main.metrics)
    metrics["comparison"] = rows
    metrics["latent_model"] = _latent_summary(LATENT, runs[LATENT][1], cfg.latent.steps,
                                              curve_batches)
    metrics["counterparts"] = {name: res.metrics for name, (role, res, _) in runs.items()
                               if role != "configured"}
    metrics.update(extra)
    return dataclasses.replace(main, metrics=metrics, compared=compared)
