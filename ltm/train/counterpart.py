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
checkpoint_dir, the counterparts in subfolders (SUBFOLDERS). On a CPU the models train at once, a
process each (train.counterpart.workers): small models use a second core poorly within one
process, and none of the three reads another's weights (the equal-FLOPs model's steps follow from
the planned tokens).
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import os
import shutil
from pathlib import Path
from typing import Callable

import torch

from ltm.latent.posterior import LatentConfig
from ltm.model.config import ModelConfig
from ltm.train.settings import CounterpartConfig, TrainConfig, TrainResult
from ltm.model.lm import LTM
from ltm.train.trainer import run_training
from ltm.data.batches import with_vocab
from ltm.workers import cpu_workers, run_jobs

# a job run once the latent model is trained, (fn, args): fn(*args) -> (anything, text to say)
FollowUp = tuple[Callable, tuple]

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


def equal_flops_steps(latent_flops: float, latent_tokens: int, plain_flops: float,
                      plain_tokens_per_step: int) -> int:
    """The first step count at which a plain model of plain_flops per token, plain_tokens_per_step
    a step, has trained for the latent model's latent_flops * latent_tokens FLOPs."""
    return math.ceil(latent_flops * latent_tokens / (plain_flops * plain_tokens_per_step))


def planned_tokens(cfg: TrainConfig) -> int | None:
    """Tokens a run of cfg trains on one process, known before it runs; None when the batch size
    is found on the device (batch_size auto)."""
    if cfg.batch_size == "auto":
        return None
    return cfg.steps * cfg.batch_size * cfg.seq_len * cfg.grad_accum


def _over_cap(steps: int, budget: float, cap: int) -> str | None:
    if steps <= cap:
        return None
    return (f"skipped: over the cap (needs {steps} steps for the latent model's {budget:.3g} "
            f"training FLOPs; train.counterpart.max_equal_flops_steps is {cap})")


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


@dataclasses.dataclass(frozen=True)
class Run:
    """One model of the comparison: its name and role, what it is trained from, where its
    checkpoints go and its training FLOPs per token."""

    name: str
    role: str
    model_cfg: ModelConfig
    train_cfg: TrainConfig
    folder: Path
    flops: float


def _planned_runs(model_cfg: ModelConfig, cfg: TrainConfig, cache_dir: str,
                  out_dir: Path) -> list[Run]:
    """The configured model, then its counterpart at equal training tokens."""
    cp = cfg.counterpart
    latent_main = model_cfg.n_latent > 0 and cfg.latent.steps > 0
    resolved = with_vocab(model_cfg, cache_dir, "synthetic" if cfg.data == "synthetic" else "cache")
    main = Run(LATENT if latent_main else PLAIN, "configured", model_cfg, _normalised(cfg), out_dir,
               flops_of(resolved, cfg.seq_len, inner_passes(cfg.latent) if latent_main else 0))
    if latent_main:  # the plain model at equal tokens
        other = Run(PLAIN, "counterpart: equal tokens", dataclasses.replace(model_cfg, n_latent=0),
                    _normalised(cfg), out_dir / SUBFOLDERS[PLAIN],
                    flops_of(dataclasses.replace(resolved, n_latent=0), cfg.seq_len, 0))
    else:  # the latent model at equal tokens
        train = _latent_train_cfg(cfg, cp)
        other = Run(LATENT, "counterpart: equal tokens",
                    dataclasses.replace(model_cfg, n_latent=cp.n_latent), train,
                    out_dir / SUBFOLDERS[LATENT],
                    flops_of(dataclasses.replace(resolved, n_latent=cp.n_latent), cfg.seq_len,
                             inner_passes(train.latent)))
    return [main, other]


def _equal_flops_run(runs: list[Run], latent_tokens: int, plain_tokens_per_step: int, cap: int,
                     say) -> Run | str:
    """The plain model at the latent model's training FLOPs, or why not (over `cap`,
    train.counterpart.max_equal_flops_steps)."""
    by_name = {run.name: run for run in runs}
    latent, plain = by_name[LATENT], by_name[PLAIN]
    cfg = plain.train_cfg
    steps = equal_flops_steps(latent.flops, latent_tokens, plain.flops, plain_tokens_per_step)
    why = _over_cap(steps, latent.flops * latent_tokens, cap)
    if why is not None:
        say(f"plain model at equal training FLOPs {why}")
        return why
    folder = runs[0].folder / SUBFOLDERS[PLAIN_FLOPS]
    say(f"counterpart (plain, equal training FLOPs: {steps} steps) in {folder}")
    return Run(PLAIN_FLOPS, "counterpart: equal FLOPs", plain.model_cfg,
               dataclasses.replace(cfg, steps=steps), folder, plain.flops)


def train_quietly(run: Run, cache_dir: str, at_once: int) -> tuple[TrainResult, str]:
    """A worker's job: one model trained without a bar, `at_once` models training together. What
    it prints comes back as text for the parent to say: a worker's own print would bypass the
    notebook running the stage."""
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        result = run_training(run.model_cfg, run.train_cfg, cache_dir, str(run.folder), False,
                              stamp=at_once_stamp(at_once))
    return result, text.getvalue()


def at_once_stamp(at_once: int) -> dict:
    """How a model's tokens/s was measured, saved with its metrics: a model trained beside
    another process on a CPU runs at about half its speed alone, so the report compares the
    number only between runs trained alike."""
    return {"models_at_once": at_once}


def side_by_side_workers(cfg: TrainConfig) -> int:
    """Processes training the comparison's models at once: train.counterpart.workers (0 = one per
    core) on a CPU run of one process whose tokens are known before it trains; else 1, every
    model in turn here (a GPU, torchrun, batch_size auto)."""
    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if cuda or int(os.environ.get("WORLD_SIZE", "1")) > 1 or planned_tokens(cfg) is None:
        return 1
    return cpu_workers(cfg.counterpart.workers, 3, torch.device("cpu"))


def _train_side_by_side(runs: list[Run], cfg: TrainConfig, cache_dir: str, workers: int,
                        say, after_latent: FollowUp | None = None
                        ) -> tuple[list[TrainResult], Run | str | None]:
    """Every model at once on `workers` processes, the equal-FLOPs model's steps reckoned from the
    planned tokens (those the models train are checked against them); after_latent on the worker
    the latent model leaves."""
    tokens = planned_tokens(cfg)
    flops_run = (_equal_flops_run(runs, tokens, tokens // cfg.steps,
                                  cfg.counterpart.max_equal_flops_steps, say)
                 if cfg.counterpart.equal_flops else None)
    todo = runs + ([flops_run] if isinstance(flops_run, Run) else [])
    say(f"training {len(todo)} models at once on {workers} processes")
    # the costliest first (training FLOPs): they start first, the cheapest fills the gap
    order = sorted(range(len(todo)), key=lambda i: -todo[i].flops * todo[i].train_cfg.steps)
    latent = next(k for k, i in enumerate(order) if todo[i].name == LATENT)
    done = run_jobs(train_quietly, [(todo[i], cache_dir, workers) for i in order], workers,
                    lambda _, result: say(result[1].rstrip()) if result[1].strip() else None,
                    after={latent: after_latent} if after_latent else None)
    results = [result for _, (result, _) in sorted(zip(order, done[:len(todo)]))]
    for run, result in zip(todo, results):
        trained = result.metrics["steps"] * result.metrics["tokens_per_step"]
        if trained != run.train_cfg.steps * tokens // cfg.steps:
            raise RuntimeError(f"{run.name} trained {trained} tokens, not the "
                               f"{run.train_cfg.steps * tokens // cfg.steps} planned")
    return results, flops_run


def _train_in_turn(runs: list[Run], cfg: TrainConfig, cache_dir: str, progress: bool,
                   say) -> tuple[list[TrainResult], Run | str | None]:
    """The models one after the other here, the equal-FLOPs model's steps from what the latent
    model trained."""
    results = []
    for run in runs:
        if run.role != "configured":
            say(_counterpart_line(run))
        results.append(run_training(run.model_cfg, run.train_cfg, cache_dir, str(run.folder),
                                    progress, at_once_stamp(1)))
    flops_run = None
    if cfg.counterpart.equal_flops:
        by_name = {run.name: result.metrics for run, result in zip(runs, results)}
        latent, plain = by_name[LATENT], by_name[PLAIN]
        flops_run = _equal_flops_run(runs, latent["steps"] * latent["tokens_per_step"],
                                     plain["tokens_per_step"],
                                     cfg.counterpart.max_equal_flops_steps, say)
        if isinstance(flops_run, Run):
            results.append(run_training(flops_run.model_cfg, flops_run.train_cfg, cache_dir,
                                        str(flops_run.folder), progress, at_once_stamp(1)))
    return results, flops_run


def _counterpart_line(run: Run) -> str:
    steps = run.train_cfg.latent.steps
    return (f"counterpart ({run.name}, equal training tokens) in {run.folder}"
            + (f": n_latent {run.model_cfg.n_latent}, {steps} inner step{'' if steps == 1 else 's'}"
               if run.name == LATENT else ""))


def train_with_counterparts(model_cfg: ModelConfig, cfg: TrainConfig, cache_dir: str,
                            out_dir: str | Path, progress: bool = True, say=print,
                            after_latent: FollowUp | None = None) -> TrainResult:
    """Train the configured model in out_dir, and (train.counterpart.enabled) its counterpart at
    equal training tokens and a plain model at equal training FLOPs, each in its subfolder: at
    once on a CPU's cores (side_by_side_workers), else in turn. The result is the configured
    model's, its metrics extended by `comparison`, `latent_model` and `counterparts` (each
    counterpart's metrics), and `compared` holds every model's loss curve (history rows with a
    `model` key). after_latent (the prior's training, say) runs once the latent model is trained:
    side by side, on the worker that model leaves while another model still trains, here on every
    core when none does (ltm.workers.run_jobs); in turn, after every model."""
    cp, out_dir = cfg.counterpart, Path(out_dir)
    latent_main = model_cfg.n_latent > 0 and cfg.latent.steps > 0
    used = set() if not cp.enabled else {PLAIN if latent_main else LATENT} | (
        {PLAIN_FLOPS} if cp.equal_flops else set())
    remove_stale_counterparts(out_dir, used, say)
    if not cp.enabled:
        result = run_training(model_cfg, _normalised(cfg), cache_dir, str(out_dir), progress,
                              at_once_stamp(1))
        _run_here(after_latent, say)
        return result
    runs = _planned_runs(model_cfg, cfg, cache_dir, out_dir)
    workers = side_by_side_workers(cfg)
    if workers > 1:
        for run in runs[1:]:
            say(_counterpart_line(run))
        results, flops_run = _train_side_by_side(runs, cfg, cache_dir, workers, say, after_latent)
    else:
        results, flops_run = _train_in_turn(runs, cfg, cache_dir, progress, say)
        _run_here(after_latent, say)
    return _compared(runs, results, flops_run, cfg)


def _run_here(job: FollowUp | None, say) -> None:
    """A follow-up in this process (when there is one), its text said."""
    if job is not None:
        text = job[0](*job[1])[1]
        if text.strip():
            say(text.rstrip())


def _compared(runs: list[Run], results: list[TrainResult], flops_run: Run | str | None,
              cfg: TrainConfig) -> TrainResult:
    """The configured model's result with the comparison of every model (see
    train_with_counterparts)."""
    trained = list(zip(runs + ([flops_run] if isinstance(flops_run, Run) else []), results))
    rows = [_row(run.name, run.role, result, run.flops) for run, result in trained]
    if isinstance(flops_run, str):
        rows.append(_skipped(PLAIN_FLOPS, "counterpart: equal FLOPs", flops_run))
    latent = next(i for i, run in enumerate(runs) if run.name == LATENT)
    main = results[0]
    metrics = dict(main.metrics)
    metrics["comparison"] = rows
    metrics["latent_model"] = _latent_summary(LATENT, results[latent], cfg.latent.steps,
                                              runs[latent].train_cfg.latent.eval_batches)
    metrics["counterparts"] = {run.name: result.metrics for run, result in trained
                               if run.role != "configured"}
    if isinstance(flops_run, Run):
        metrics["equal_flops_steps"] = flops_run.train_cfg.steps
    compared = [dict(r, model=run.name) for run, result in trained for r in result.history]
    return dataclasses.replace(main, metrics=metrics, compared=compared)
