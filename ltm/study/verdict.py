"""Paired comparisons of per-sequence scores: a difference of means with its standard error over
sequences (each sequence scored by both sides) and over training seeds (each seed trains every
model anew on the same sequences), and the one-line verdicts the report leads with."""
from __future__ import annotations

import math

import numpy as np

# the study's claims: a difference counts when it exceeds this many standard errors
SIGNIFICANT_SE = 5.0


def paired(control: np.ndarray, model: np.ndarray) -> dict:
    """control - model per sequence (N,) each: mean, its standard error, and mean / SE. Positive:
    the model scores lower (better) than the control."""
    diff = np.asarray(control, dtype=np.float64) - np.asarray(model, dtype=np.float64)
    n = len(diff)
    se = float(diff.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    mean = float(diff.mean())
    return {"mean": mean, "se": se, "z": mean / se if se > 0 else float("nan"), "sequences": n}


def mean_se(values: np.ndarray) -> dict:
    """Mean and standard error over sequences."""
    values = np.asarray(values, dtype=np.float64)
    se = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else float("nan")
    return {"mean": float(values.mean()), "se": se}


def _over_seeds(values: np.ndarray) -> tuple[float, float, float | None]:
    """(S, N): S training seeds scoring the same N sequences -> mean, its standard error, and the
    standard deviation of the seeds' means (None with one seed). The SE adds the seeds' spread to
    the sequences' sampling, sqrt(sd_seq^2 / N + sd_seed^2 / S) with sd_seq over the per-sequence
    means across seeds: the seed-by-sequence noise is counted twice, a little conservative."""
    values = np.asarray(values, dtype=np.float64)
    per_sequence, per_seed = values.mean(0), values.mean(1)
    seqs, seeds = values.shape[1], values.shape[0]
    se_seq = float(per_sequence.std(ddof=1) / math.sqrt(seqs)) if seqs > 1 else float("nan")
    sd_seed = float(per_seed.std(ddof=1)) if seeds > 1 else None
    se = math.sqrt(se_seq ** 2 + (sd_seed ** 2 / seeds if sd_seed is not None else 0.0))
    return float(values.mean()), se, sd_seed


def paired_over_seeds(control: np.ndarray, model: np.ndarray) -> dict:
    """control - model, (S, N) each: `paired` over sequences and seeds together; also the seed
    spread and each seed's own mean. One seed gives `paired`'s numbers."""
    diff = np.asarray(control, dtype=np.float64) - np.asarray(model, dtype=np.float64)
    mean, se, sd_seed = _over_seeds(diff)
    return {"mean": mean, "se": se, "z": mean / se if se > 0 else float("nan"),
            "sequences": diff.shape[1], "seeds": diff.shape[0], "seed_sd": sd_seed,
            "per_seed": [float(v) for v in diff.mean(1)]}


def mean_se_over_seeds(values: np.ndarray) -> dict:
    """Mean and standard error over seeds and sequences, (S, N); the seeds' spread."""
    mean, se, sd_seed = _over_seeds(values)
    return {"mean": mean, "se": se, "seed_sd": sd_seed}


def sentence(label: str, comparison: dict) -> str:
    """'latent beats <label> by 0.123 +- 0.004 nats/token (31 SE)' or the opposite, or a tie."""
    mean, se, z = comparison["mean"], comparison["se"], comparison["z"]
    seeds = comparison.get("seeds", 1)
    over = f", {seeds} seeds" if seeds > 1 else ""
    size = f"{abs(mean):.3f} +- {se:.3f} nats/token ({abs(z):.0f} SE{over})"
    if not abs(z) > SIGNIFICANT_SE:
        return (f"latent vs {label}: no difference beyond {SIGNIFICANT_SE:.0f} SE "
                f"({mean:+.3f} +- {se:.3f}{over})")
    return f"latent {'beats' if mean > 0 else 'loses to'} {label} by {size}"


def verdict(source: str, comparisons: dict[str, dict], labels: dict[str, str]) -> list[str]:
    """One sentence per control of a source, in the order of `labels`."""
    return [f"{source}: {sentence(labels[name], comparisons[name])}"
            for name in labels if name in comparisons]
