"""The workbook's figures: made without pyplot, so nothing global is switched (a notebook keeps
its inline backend and shows each figure once, where it is displayed) and no window opens. The
stage notebooks show them; the report embeds them."""
from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, MaxNLocator


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


VERDICT_COLORS = {"PASS": "tab:green", "FAIL": "tab:red", "NO EFFECT": "tab:gray",
                  "SLOWER": "tab:orange", "BASELINE": "tab:blue", "SKIPPED": "white"}


def ablate_figure(table: pd.DataFrame) -> Figure:
    """Per change of the ablate stage: the speed-up over the baseline it was measured against
    (whiskers: the range over both spreads) and its change of the validation loss beside the
    tolerance, coloured by verdict. Linear axes; the loss panel is zoomed to the differences."""
    table = table.reset_index(drop=True)
    verdicts = table.get("verdict", pd.Series(["BASELINE"] * len(table)))
    colors = [VERDICT_COLORS.get(v, "tab:blue") for v in verdicts]
    labels = [f"{s}  [{v}]" if "verdict" in table else str(s)
              for s, v in zip(table["switch"], verdicts)]
    y = list(range(len(table)))[::-1]
    # constrained layout: tight_layout cut the long switch labels at the left edge
    fig = Figure(figsize=(13, 0.45 * len(table) + 1.8), layout="constrained")
    speed, loss = fig.subplots(1, 2, sharey=True)
    if {"speedup_low", "speedup_high"} <= set(table):
        low = (table["speedup"] - table["speedup_low"]).clip(lower=0)
        high = (table["speedup_high"] - table["speedup"]).clip(lower=0)
        speed.errorbar(table["speedup"], y, xerr=[low, high], fmt="none", ecolor="black",
                       capsize=3, linewidth=0.8)
    speed.barh(y, table["speedup"] - 1.0, left=1.0, color=colors, edgecolor="black", linewidth=0.5)
    speed.axvline(1.0, color="black", linewidth=0.8)
    speed.set_yticks(y, labels)
    speed.set_xlabel("speed-up (step time of the baseline / of the change)")
    speed.set_title("speed (whiskers: spread of the repeats)")
    _loss_panel(loss, table, y, colors)
    return fig


def _loss_panel(ax, table: pd.DataFrame, y: list[int], colors: list[str]) -> None:
    """Change of the validation loss per row; the tolerance as a grey band. The axis spans the
    tolerances and the deltas of the rows that kept quality; a delta beyond it is drawn to the
    edge and labelled with its value."""
    delta = (table["delta_val_loss"] if "delta_val_loss" in table
             else table["val_loss"] - table["val_loss"].iloc[0]).fillna(0.0)
    tolerance = table["tolerance"] if "tolerance" in table else pd.Series(0.0, index=table.index)
    inside = delta[delta.abs() <= tolerance.fillna(0.0)]
    limit = 1.25 * max([*inside.abs(), *tolerance.fillna(0.0), 1e-9])
    if not len(inside) or "tolerance" not in table:  # nothing to zoom to: show every delta
        limit = 1.1 * max(delta.abs().max(), 1e-9)
    for row, tol in zip(y, tolerance.fillna(0.0)):
        ax.fill_betweenx([row - 0.4, row + 0.4], -tol, tol, color="0.9", zorder=0)
    ax.barh(y, delta.clip(-limit, limit), color=colors, edgecolor="black", linewidth=0.5)
    for row, value in zip(y, delta):
        if abs(value) > limit:
            ax.annotate(f"{value:+.3g}", (limit if value > 0 else -limit, row), ha="center",
                        va="center", fontsize=8,
                        bbox={"boxstyle": "round", "fc": "white", "ec": "tab:red"})
        elif value != 0:  # a delta far inside a wide band is too thin a bar to read
            ax.annotate(f"{value:+.1e}", (value, row), xytext=(3 if value > 0 else -3, 0),
                        textcoords="offset points", ha="left" if value > 0 else "right",
                        va="center", fontsize=7)
    ax.set_xlim(-limit, limit)
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel("validation loss - the baseline's (band: tolerance)")
    ax.set_title("quality on the fixed validation set")


def profile_figure(profile: pd.DataFrame) -> Figure:
    """Milliseconds per training step by operation group, one stacked bar per configuration,
    from rows (config, group, ms); groups with no time in any configuration are left out."""
    if profile.empty:
        fig = Figure(figsize=(6, 1))
        fig.text(0.5, 0.5, "no profile (ablate.profile_steps is 0)", ha="center")
        return fig
    wide = profile.pivot_table(index="config", columns="group", values="ms", sort=False,
                               aggfunc="sum")
    wide = wide.loc[:, (wide > 0).any()]
    fig = Figure(figsize=(7.5, 0.6 * len(wide) + 2.2), layout="constrained")
    ax = fig.subplots()
    left = pd.Series(0.0, index=wide.index)
    palette = sns.color_palette("tab20", len(wide.columns))
    for color, group in zip(palette, wide.columns):
        ax.barh(list(wide.index), wide[group], left=left, label=group, color=color)
        left += wide[group]
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds per step")
    ax.set_title("where a training step's time goes")
    fig.legend(ncols=4, fontsize=8, loc="outside lower center")
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
        fig = Figure(figsize=(5.6, 0.45 * rows["case"].nunique() + 1.6), layout="constrained")
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


def latent_by_steps(latent: dict) -> pd.DataFrame:
    """Rows (inference steps, NELBO bound, prefix NLL) of a latent model's metrics (train.json's
    latent_model, or a latent model's own metrics): latent_figure's first argument."""
    bound = latent.get("val_nelbo_by_steps") or {}
    prefix = latent.get("val_prefix_nll_by_steps") or {}
    return pd.DataFrame([{"inference steps": int(k), "NELBO bound": v,
                          "prefix NLL": prefix.get(k, prefix.get(str(k)))}
                         for k, v in bound.items()])


def latent_figure(by_steps: pd.DataFrame, comparison: pd.DataFrame | None = None,
                  curves: pd.DataFrame | None = None) -> Figure:
    """Latent thoughts against plain models. First the latent model against the inference steps
    fitting q(z) (rows of by_steps: "inference steps", "NELBO bound", "prefix NLL"): its NELBO
    bound beside each plain model's exact NLL, then (where by_steps has it) its suffix NLL given
    the prefix beside each plain model's, the plain models from the comparison table (rows:
    model, kind, val_loss, val_prefix_nll) as level lines. Then, with curves (rows: model, split,
    step, loss) and the table's steps, tokens and training_flops: the validation loss of every
    model against training tokens and against training FLOPs (a latent model's is its bound)."""
    has_prefix = "prefix NLL" in by_steps and by_steps["prefix NLL"].notna().any()
    has_curves = curves is not None and len(curves) and comparison is not None
    panels = 1 + int(has_prefix) + 2 * int(bool(has_curves))
    # one row no wider than the report's column (1380 px at its 110 dpi): four 4.6-in panels were
    # drawn at three quarters of their size there, their 7-pt legends at 7 px; two rows cost height
    fig = Figure(figsize=(min(4.6, 12.4 / panels) * panels, 3.4), layout="constrained")
    axes = list(fig.subplots(1, panels, squeeze=False)[0])
    plain = (comparison[(comparison["kind"] == "plain") & comparison["val_loss"].notna()]
             if comparison is not None and "val_loss" in comparison else pd.DataFrame())
    steps = by_steps["inference steps"]
    panels_by_steps = [("NELBO bound", "val_loss", "NELBO bound (whole sequence)", "NLL", "o-")]
    if has_prefix:
        panels_by_steps.append(("prefix NLL", "val_prefix_nll", "suffix NLL given the prefix",
                                "suffix NLL", "s-"))
    for ax, (column, plain_column, title, plain_label, style) in zip(axes, panels_by_steps):
        ax.plot(steps, by_steps[column], style, color=SPLIT_COLORS["val"], label="latent")
        for (_, row), line in zip(plain.iterrows(), ["--", ":", "-."]):
            if pd.notna(row.get(plain_column)):
                ax.axhline(row[plain_column], color="black", linestyle=line, linewidth=1,
                           label=f"{row['model']}: {plain_label}")
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xticks(list(steps), [str(int(n)) for n in steps])
        ax.set_xlabel("inference steps fitting q(z)")
        ax.set_title(f"latent model: {title}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("nats per token")
    if not has_curves:
        return fig
    table = comparison.set_index("model")
    val = curves[curves["split"] == "val"]
    for ax, (column, label) in zip(axes[-2:], [("tokens", "training tokens"),
                                              ("training_flops", "training FLOPs")]):
        for model, rows in val.groupby("model", sort=False):
            if model not in table.index or pd.isna(table.loc[model, column]):
                continue
            per_step = table.loc[model, column] / table.loc[model, "steps"]
            kind = table.loc[model, "kind"]
            ax.plot(rows["step"] * per_step, rows["loss"], "o-" if kind == "latent" else "s--",
                    markersize=4, label=f"{model} ({'NELBO bound' if kind == 'latent' else 'NLL'})")
        ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
        ax.locator_params(axis="x", nbins=5)
        ax.set_xlabel(label)
        ax.set_title(f"validation loss against {label}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return fig

def kernel_grid_figure(grid: pd.DataFrame) -> Figure:
    """Time over the floor against shape, ours and fla, one panel per op and pass (log x axis:
    the ratios span 2x to 100x), from `ltm.bench.kernel_grid.grid_table` rows (columns op, B, T, H, D,
    pass, ours_x_floor, fla_x_floor; with ours_x_floor_graph, ours from CUDA-graph GPU time as a
    ring). A shape where fla's point lies left of ours is one where fla wins; a filled point far
    right of its ring is one whose do_bench time was the host's."""
    grid = grid.assign(shape=grid["B"].astype(str) + "," + grid["T"].astype(str) + ","
                       + grid["H"].astype(str) + "," + grid["D"].astype(str))
    panels = list(grid.groupby(["op", "pass"], sort=False))
    n_shapes = grid["shape"].nunique()
    # at most three panels a row: six side by side drew 3,300 px, its text unreadable on the page
    cols = min(3, max(1, len(panels)))
    rows_of_panels = -(-max(1, len(panels)) // cols)
    fig = Figure(figsize=(4.2 * cols + 1.5, rows_of_panels * (0.25 * n_shapes + 1.4)),
                 layout="constrained")
    axes = fig.subplots(rows_of_panels, cols, sharey=True, squeeze=False).ravel()
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    for ax, ((op, pass_), rows) in zip(axes, panels):
        for impl, column in (("triton", "ours_x_floor"), ("fla", "fla_x_floor")):
            part = rows[rows[column].notna()] if column in rows else rows.iloc[:0]
            ax.plot(part[column], part["shape"], "o", color=_color(impl),
                    label="ours" if impl == "triton" else impl, markersize=6)
        if "ours_x_floor_graph" in rows:
            part = rows[rows["ours_x_floor_graph"].notna()]
            ax.plot(part["ours_x_floor_graph"], part["shape"], "o", markerfacecolor="none",
                    color=_color("triton"), label="ours, GPU time", markersize=9)
        ax.set_xscale("log")
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel("time / floor (x, lower is better)")
        ax.set_title(f"{op} {pass_}")
        ax.grid(axis="x", alpha=0.3)
    for ax in axes[::cols]:
        ax.set_ylabel("B,T,H,D")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside right upper")
    return fig


def time_to_loss_figure(curves: dict[str, list[dict]], target: float | None = None) -> Figure:
    """Validation loss against training seconds (evaluations left out) and against tokens, one
    line per configuration; curves: name -> val rows (loss, train_seconds, tokens), as the train
    stage's history holds them; target: a dashed line at the target loss."""
    fig = Figure(figsize=(11, 3.4), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    for ax, x, label in zip(axes, ("train_seconds", "tokens"),
                            ("training seconds (evaluations left out)", "tokens")):
        for name, rows in curves.items():
            ax.plot([r[x] for r in rows], [r["loss"] for r in rows], marker="o", markersize=3,
                    label=name)
        if target is not None:
            ax.axhline(target, color="black", linestyle="--", linewidth=0.8)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    # token counts in engineering units (400k, 1.2M): plain integers ran together on the axis
    axes[1].xaxis.set_major_formatter(EngFormatter(sep=""))
    axes[1].xaxis.set_major_locator(MaxNLocator(5))
    axes[0].set_ylabel("validation loss (nats per token)")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside right upper")
    fig.suptitle("time to target: validation loss against time and tokens")
    return fig


# the reference lines of prior_figure: sources of z or text that are not the prior's samplers
PRIOR_REFERENCES = {"posterior (held-out)": ("black", "-"), "posterior (train split)": ("black", ":"),
                    "plain LM": ("#9467bd", "--"), "held-out text": ("#2ca02c", "-.")}


def prior_figure(table: pd.DataFrame) -> Figure:
    """The learned prior's steps against quality (rows of the benchmark's prior.csv: source,
    sampler, evaluations, mmd2, mmd2_noise, gen_ppl, gen_nll_noise): DPM-Solver++ by denoiser
    evaluations, the 1000-step DDPM baseline as a point, each with one standard error, and the
    other sources (N(0, I) at each scale, the posteriors, the plain LM, the data) as level
    lines; left the MMD^2 to held-out posteriors, right the generated text's perplexity under
    the plain LM."""
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    axes = fig.subplots(1, 2)
    prior = table[table["source"] == "prior"]
    dpm = prior[prior["sampler"] == "DPM-Solver++"].sort_values("evaluations")
    ddpm = prior[prior["sampler"] != "DPM-Solver++"]
    others = table[table["source"] != "prior"]
    for ax, (column, noise, title) in zip(axes, [
            ("mmd2", "mmd2_noise", "MMD$^2$ to held-out posteriors (lower is closer)"),
            ("gen_ppl", "gen_nll_noise", "generative perplexity under the plain LM")]):
        sns.lineplot(data=dpm, x="evaluations", y=column, marker="o", color="#d62728",
                     label="DPM-Solver++", ax=ax)
        ax.errorbar(dpm["evaluations"], dpm[column], yerr=_prior_error(dpm, column, noise),
                    fmt="none", color="#d62728", capsize=3)
        ax.errorbar(ddpm["evaluations"], ddpm[column], yerr=_prior_error(ddpm, column, noise),
                    fmt="s", color="#1f77b4", capsize=3, label="DDPM (ancestral)")
        gaussian_styles = iter(["--", (0, (1, 1)), "-.", (0, (5, 1))])
        for _, row in others.iterrows():
            if pd.isna(row.get(column)):
                continue
            color, style = PRIOR_REFERENCES.get(row["source"],
                                                ("#7f7f7f", next(gaussian_styles, "--")))
            ax.axhline(row[column], color=color, linestyle=style, linewidth=1, label=row["source"])
        ax.set_xscale("log")
        if column == "mmd2":  # N(0, I) lies orders of magnitude above the prior
            ax.set_yscale("symlog", linthresh=1e-3)
        ax.set_xlabel("denoiser evaluations per z")
        ax.set_ylabel(column)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return fig


def _prior_error(rows: pd.DataFrame, column: str, noise: str) -> list:
    """One standard error around each value; for a perplexity exp(nll), exp(nll -+ se)."""
    if column != "gen_ppl":
        return [rows[noise].tolist()] * 2
    nll, se = np.log(rows[column].to_numpy()), rows[noise].to_numpy()
    return [(rows[column] - np.exp(nll - se)).tolist(), (np.exp(nll + se) - rows[column]).tolist()]
