"""The workbook's figures: made without pyplot, so nothing global is switched (a notebook keeps
its inline backend and shows each figure once, where it is displayed) and no window opens. The
stage notebooks show them; the report embeds them."""
from __future__ import annotations

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure


def loss_figure(curve: pd.DataFrame) -> Figure:
    """Train and validation loss per step, from rows (step, split, loss)."""
    fig = Figure(figsize=(7, 3.5))
    ax = fig.subplots()
    sns.lineplot(data=curve, x="step", y="loss", hue="split", marker=".", ax=ax)
    ax.set_title("loss per step")
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
    """One bar chart of milliseconds per benchmark group, implementations side by side."""
    figures = []
    for group, rows in table.groupby("group", sort=False):
        fig = Figure(figsize=(8, 0.4 * len(rows) + 1.5))
        ax = fig.subplots()
        sns.barplot(data=rows, y="case", x="ms", hue="impl", ax=ax)
        ax.set_xscale("log")
        ax.set_title(f"{group}: milliseconds (log scale, lower is better)")
        fig.tight_layout()
        figures.append(fig)
    return figures
