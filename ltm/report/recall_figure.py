"""The recall benchmark's figure and summary line (ltm.bench.recall): accuracy against distance per
mixer with standard errors and the window marked, the training loss beside it, and the best mixer
beyond the window. Shown by the benchmark notebook and the report (ltm.report.recall)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure


def _bin_centre(table: pd.DataFrame) -> np.ndarray:
    """Each bin drawn at the geometric middle of its distances (the axis is log 2)."""
    return np.sqrt((table["low"].to_numpy() + 1) * table["high"].to_numpy())


def recall_figure(table: pd.DataFrame, metrics: dict, curve: pd.DataFrame | None = None,
                  commit: str | None = None) -> Figure:
    """Accuracy against distance (one line per mixer, whiskers ± SE, the window a dashed line,
    chance a dotted one) and, given the loss curve, the training loss per mixer beside it. The
    title names the device and, given, the commit."""
    fig = Figure(figsize=(11 if curve is not None else 6.5, 3.8), layout="constrained")
    axes = fig.subplots(1, 2 if curve is not None else 1, squeeze=False)[0]
    ax = axes[0]
    mixers = list(dict.fromkeys(table["mixer"]))
    palette = dict(zip(mixers, sns.color_palette(n_colors=len(mixers))))
    rows = table.assign(distance=_bin_centre(table))
    sns.lineplot(rows, x="distance", y="accuracy", hue="mixer", palette=palette, marker="o", ax=ax)
    for mixer, part in rows.groupby("mixer", sort=False):
        ax.errorbar(part["distance"], part["accuracy"], yerr=part["se"], fmt="none",
                    color=palette[mixer], capsize=3)
    window = metrics["settings"]["window"]
    ax.axvline(window, color="black", linestyle="--", linewidth=1, label=f"window ({window})")
    ax.axhline(metrics["chance"], color="gray", linestyle=":", linewidth=1, label="chance")
    ax.set_xscale("log", base=2)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("distance from the pair to its query (tokens; bins, drawn at their middle)")
    ax.set_ylabel("recall accuracy (± SE)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    if curve is not None:
        # the mean over the training seeds (no band: a bootstrap per step costs seconds)
        sns.lineplot(curve, x="step", y="loss", hue="mixer", palette=palette, ax=axes[1],
                     errorbar=None, legend=False, linewidth=1)
        axes[1].set_ylabel("training loss on the answers (nats)")
        axes[1].grid(alpha=0.3)
    where = metrics.get("device", "?") + (f", commit {commit[:8]}" if commit else "")
    fig.suptitle(f"recall against distance ({where})")
    return fig


def recall_summary(metrics: dict) -> str:
    """One line: the best mixer beyond the window, against sliding-window attention if run."""
    best = metrics["best_beyond_window"]
    line = (f"Recall beyond the {metrics['settings']['window']}-token window: best "
            f"{best['mixer']} {best['accuracy']:.3f} ± {best['se']:.3f}")
    sliding = metrics["by_mixer"].get("attention:window")
    if sliding and best["mixer"] != "attention:window":
        far = sliding["beyond_window"]
        line += f" (sliding-window attention {far['accuracy']:.3f} ± {far['se']:.3f})"
    line += f"; chance {metrics['chance']:.3f}."
    return line + "".join(f" {margin}." for margin in window_margins(metrics))


def window_margins(metrics: dict) -> list[str]:
    """Each other `:window` model (a memory beside the same sliding window: titans:window) against
    sliding-window attention beyond the window: the mean paired difference over the training
    seeds with its standard error (ltm.bench.recall.margins_over_window)."""
    seeds = metrics["settings"].get("seeds", 1)
    noise = (f"the spread over {seeds} training seeds and the evaluation's sampling" if seeds > 1
             else "evaluation noise only, one training seed")
    return [f"{mixer} minus sliding-window attention beyond the window: {m['difference']:+.3f} ± "
            f"{m['se']:.3f} ({abs(m['difference']) / m['se']:.1f} standard errors; {noise})"
            for mixer, m in metrics.get("margins_over_sliding_window", {}).items()]
