"""Paired comparisons of per-sequence scores: a difference of means with its standard error over
sequences (each sequence scored by both sides), and the one-line verdicts the report leads with."""
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


def sentence(label: str, comparison: dict) -> str:
    """'latent beats <label> by 0.123 +- 0.004 nats/token (31 SE)' or the opposite, or a tie."""
    mean, se, z = comparison["mean"], comparison["se"], comparison["z"]
    size = f"{abs(mean):.3f} +- {se:.3f} nats/token ({abs(z):.0f} SE)"
    if not abs(z) > SIGNIFICANT_SE:
        return f"latent vs {label}: no difference beyond {SIGNIFICANT_SE:.0f} SE ({mean:+.3f} +- {se:.3f})"
    return f"latent {'beats' if mean > 0 else 'loses to'} {label} by {size}"


def verdict(source: str, comparisons: dict[str, dict], labels: dict[str, str]) -> list[str]:
    """One sentence per control of a source, in the order of `labels`."""
    return [f"{source}: {sentence(labels[name], comparisons[name])}"
            for name in labels if name in comparisons]
