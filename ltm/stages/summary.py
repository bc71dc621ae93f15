"""Each stage's headline metrics: the few numbers `dvc metrics diff` and `dvc exp show` compare.

A stage writes every number it measured to its results file (reports/results/<stage>.json, the
report's input, which DVC tracks as an output but does not diff) and the headline below to its
metrics file (reports/metrics/<stage>.json, what dvc.yaml declares as metrics), so a comparison
across commits or experiments is tens of lines, not hundreds.

Names say whose a number is and what it is: `lm.val_nll` is the trained language model's
validation NLL (nats/token); a latent model's is a bound (NLL + KL, `lm.val_nll_bound`), never the
same name; the prior's denoising losses are `prior.loss_*`. A `<name>_noise` beside a value is its
measured standard error (the report calls a change real beyond twice the combined noise).
Timings move between runs on the same commit: their noise, where measured, is beside them.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

# decimals kept: losses to 1e-4 (their noise is ~1e-2), ratios and speed-ups to 1e-3
LOSS_DECIMALS = 4
RATIO_DECIMALS = 3


def _round(value, decimals: int):
    if isinstance(value, float) and math.isfinite(value):
        return round(value, decimals)
    return value


def _pick(source: dict | None, keys: dict[str, str], decimals: int) -> dict:
    """{new name: source[old name]} for the keys present, rounded."""
    source = source or {}
    return {new: _round(source[old], decimals) for new, old in keys.items()
            if source.get(old) is not None}


def tokenize_summary(metrics: dict) -> dict:
    """The token cache's size (no timing: the cache is the same on every run)."""
    keys = ("documents", "tokens", "train_tokens", "val_tokens", "vocab_size", "bytes_per_token")
    return {k: metrics[k] for k in keys if k in metrics}


def _model_summary(metrics: dict) -> dict:
    """A trained model's headline: its validation NLL (a bound for a latent model) with noise,
    the second half's NLL given the first half, and its speed."""
    latent = bool(metrics.get("n_latent"))
    loss = "val_nll_bound" if latent else "val_nll"
    out = {"model": f"{metrics.get('mixer', '?')}" + (f" + {metrics['n_latent']} latents" if latent else ""),
           "params": metrics.get("params")}
    out.update(_pick(metrics, {loss: "val_loss", f"{loss}_noise": "val_loss_noise",
                               "val_prefix_nll": "val_prefix_nll",
                               "val_prefix_nll_noise": "val_prefix_nll_noise"}, LOSS_DECIMALS))
    out.update(_pick(metrics, {"tokens_per_s": "tokens_per_s", "tokens_per_s_noise": "tokens_per_s_noise",
                               "peak_memory_mib": "peak_memory_mib",
                               # processes training at once when tokens/s was measured (1: alone)
                               "models_at_once": "models_at_once"}, 1))
    return out


def study_summary(study: dict | None) -> dict:
    """Per source: the latent model's suffix-NLL gain over the parameter-matched plain model and
    over another sequence's z, each with its standard error (paired over sequences)."""
    out = {}
    for source, result in ((study or {}).get("sources") or {}).items():
        gains = result.get("gain_over") or {}
        row = {}
        for control, name in (("plain", "latent_gain_over_plain"), ("shuffled", "own_z_gain_over_shuffled")):
            if control in gains:
                row[name] = _round(gains[control]["mean"], LOSS_DECIMALS)
                row[f"{name}_noise"] = _round(gains[control]["se"], LOSS_DECIMALS)
        out[source] = row
    return out


def train_summary(train: dict, prior: dict | None = None, prior_bench: dict | None = None) -> dict:
    """The train stage's headline: the model (`lm`), its counterparts, the prior's losses and its
    benchmark's two answers: how few solver evaluations match DDPM, and whether the prior beats
    the best Gaussian."""
    out = {"lm": _model_summary(train)}
    counterparts = {name: _model_summary(metrics) for name, metrics in
                    (train.get("counterparts") or {}).items()}
    for summary in counterparts.values():  # their noise and speed are in the results file
        for key in [k for k in summary if k.endswith("_noise")] + [
                "tokens_per_s", "peak_memory_mib", "seconds", "params"]:
            summary.pop(key, None)
    if counterparts:
        out["counterparts"] = counterparts
    if prior and prior.get("enabled", True) and "eval_loss_heldout" in prior:
        out["prior"] = _pick(prior, {"loss_heldout": "eval_loss_heldout",
                                     "loss_train": "eval_loss_train"}, LOSS_DECIMALS)
    if prior_bench and "fewest_dpm_evaluations_matching_ddpm" in prior_bench:
        out.setdefault("prior", {}).update({
            "fewest_solver_evaluations_matching_ddpm": prior_bench["fewest_dpm_evaluations_matching_ddpm"],
            "mmd2_over_best_gaussian": _round(prior_bench.get("prior_mmd2_over_best_gaussian"),
                                              RATIO_DECIMALS)})
    return out


def ablate_summary(ablate: dict) -> dict:
    """Per change tried: its verdict and step-time speed-up; the baseline's step time."""
    out = {}
    for name, row in ablate.items():
        if isinstance(row, dict) and "verdict" in row:
            out[name] = {"verdict": row["verdict"], "speedup": _round(row.get("speedup"), RATIO_DECIMALS)}
    if isinstance(ablate.get("baseline"), dict):
        out["baseline"] = {"step_ms": _round(ablate["baseline"].get("step_ms"), 1)}
    return out


def benchmark_summary(benchmark: dict) -> dict:
    """The benchmark stage's ratios (already its headline)."""
    return {k: v for k, v in benchmark.items() if k not in ("torch",)}


def recall_summary(recall: dict) -> dict:
    """The recall stage's headline: recall beyond the window per mixer (accuracy and its SE: the
    one number the recall task asks), and a memory's margin over the sliding window alone."""
    out: dict = {}
    if recall and recall.get("enabled"):
        out["recall_beyond_window"] = {mixer: {"accuracy": m["beyond_window"]["accuracy"],
                                               "accuracy_noise": m["beyond_window"]["se"]}
                                       for mixer, m in recall["by_mixer"].items()}
        # a memory beside the sliding window against that window alone (titans:window)
        margins = recall.get("margins_over_sliding_window") or {}
        if margins:
            out["recall_margin_over_sliding_window"] = {
                mixer: {"difference": m["difference"], "difference_noise": m["se"]}
                for mixer, m in margins.items()}
    return out


def write_summary(path: str | Path, summary: dict) -> dict:
    """Write a stage's headline metrics (one JSON file) and return them."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def read_results(path: str | Path) -> dict | None:
    """A stage's results file, or None where the stage wrote none (a skipped part)."""
    path = Path(path)
    return json.loads(path.read_text()) if path.is_file() else None
