"""The workbook's figures: made without pyplot, so nothing global is switched (a notebook keeps
its inline backend and shows each figure once, where it is displayed) and no window opens. The
stage notebooks show them; the report embeds them."""
from __future__ import annotations

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure


# one colour per implementation (and per split) in every figure, so a colour means one thing
IMPL_COLORS = {
    "naive": "#7f7f7f", "torch": "#1f77b4", "torch_chunk": "#1f77b4", "triton": "#d62728",
    "fla": "#2ca02c", "sdpa": "#9467bd", "cached": "#ff7f0e", "uncached": "#8c564b",
    "compiled": "#e377c2", "graph": "#e377c2", "int8": "#17becf", "int4": "#bcbd22",
}
SPLIT_COLORS = {"train": "#1f77b4", "val": "#d62728"}


def _color(name: str) -> str:
    return IMPL_COLORS.get(str(name), "#555555")


def loss_figure(curve: pd.DataFrame) -> Figure:
    """Train and validation loss as separate series, against steps and (where the rows carry
    `seconds`) against wall-clock seconds; rows (step, split, loss[, seconds])."""
    by_time = "seconds" in curve and curve["seconds"].notna().any()
    fig = Figure(figsize=(11 if by_time else 6, 3.4), layout="constrained")
    axes = fig.subplots(1, 2 if by_time else 1, sharey=True, squeeze=False)[0]
    for ax, x in zip(axes, ["step", "seconds"]):
        for split, rows in curve.groupby("split", sort=False):
            marker = "o" if split == "val" else None
            ax.plot(rows[x], rows["loss"], label=split, color=SPLIT_COLORS.get(split), marker=marker,
                    markersize=4, linewidth=1.2 if split == "train" else 1.8)
        ax.set_xlabel("step" if x == "step" else "wall-clock seconds of training")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("loss (nats per token)")
    # zoom to where learning happens: the first steps' loss would flatten everything after them
    tail = curve["loss"][len(curve) // 10:]
    if len(tail):
        low, high = tail.min(), tail.max()
        axes[0].set_ylim(low - 0.05 * (high - low + 1e-9), high + 0.05 * (high - low + 1e-9))
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside right upper")
    fig.suptitle("loss: train (per step) and validation (at each evaluation)")
    return fig


def ablate_figure(table: pd.DataFrame) -> Figure:
    """Speed-up and validation loss of each switch, side by side."""
    fig = Figure(figsize=(11, 0.5 * len(table) + 1.5))
    axes = fig.subplots(1, 2, sharey=True)
    sns.barplot(data=table, y="switch", x="speedup", ax=axes[0], color="tab:blue")
    axes[0].axvline(1.0, color="black", linewidth=0.8)
    axes[0].set_title("tokens/s relative to the baseline")
    sns.barplot(data=table, y="switch", x="val_loss", ax=axes[1], color="tab:orange")
    axes[1].set_title("validation loss after the same steps")
    fig.tight_layout()
    return fig


def benchmark_figures(table: pd.DataFrame) -> list[Figure]:
    """One point plot per benchmark group: each implementation's speed-up over the group's slow
    original on a linear axis with the 1x line (bars on a log axis made 1.7x look like 10x), one
    colour per implementation across all figures."""
    figures = []
    for group, rows in table.groupby("group", sort=False):
        rows = rows[rows["speedup"].notna()]
        if rows.empty:
            continue
        fig = Figure(figsize=(7, 0.45 * rows["case"].nunique() + 1.6), layout="constrained")
        ax = fig.subplots()
        for impl, part in rows.groupby("impl", sort=False):
            ax.plot(part["speedup"], part["case"].astype(str), "o", color=_color(impl), label=impl,
                    markersize=7)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xlim(0, max(1.05, rows["speedup"].max() * 1.1))
        ax.set_xlabel("speed-up over the slow original (x, higher is better)")
        ax.set_title(group)
        ax.grid(axis="x", alpha=0.3)
        fig.legend(loc="outside right upper")
        figures.append(fig)
    return figures


def latent_figure(by_steps: pd.DataFrame) -> Figure:
    """The NELBO bound against posterior-inference steps (rows: inference steps, bound)."""
    fig = Figure(figsize=(6, 3.2), layout="constrained")
    ax = fig.subplots()
    x, y = by_steps.columns[:2]
    ax.plot(by_steps[x], by_steps[y], "o-", color=SPLIT_COLORS["val"])
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel("inference steps fitting q(z) on the scored sequence")
    ax.set_ylabel("NELBO bound (nats/token)")
    ax.grid(alpha=0.3)
    return fig
