"""The latent study's tables and figure (ltm.study): the verdict lines, one table per source of
suffix NLL and gains with standard errors, and the bound by inference steps per start of q.
Shown by the train notebook and the report's first screen (ltm.report.study_sections.study_section)."""
from __future__ import annotations

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

# the study's models and controls, in the order a reader meets them
LABELS = {"latent": "latent (encoder + k steps)", "plain": "plain, as many parameters",
          "plain_equal_flops": "plain, equal training FLOPs", "shared": "one shared learned z",
          "shuffled": "latent, z of another sequence", "dynamic": "plain + dynamic evaluation",
          "exact": "exact (the source itself)", "window_floor": "best predictor in the window"}
INIT_COLORS = {"encoder": "#d62728", "authors": "#7f7f7f", "prior": "#1f77b4"}


def verdict_lines(study: dict) -> list[str]:
    """The study's one-line verdicts, or why there are none."""
    if not study.get("enabled"):
        return ["latent study: off (study.enabled false)"]
    return list(study.get("verdict") or [])


def study_table(study: dict) -> pd.DataFrame:
    """One row per source and model: suffix NLL +- SE, the gain of the latent model over it
    (control - latent, paired) +- SE, both over sequences and training seeds, and its gap to the
    exact entropy where known."""
    rows = []
    for source, s in (study.get("sources") or {}).items():
        sizes = s["params"]  # non-embedding parameters of each trained model
        for name, nll in s["suffix_nll"].items():
            gain, gap = s["gain_over"].get(name), (s.get("gap_to_exact") or {}).get(name)
            rows.append({
                "source": source, "model": LABELS.get(name, name),
                "suffix NLL": f"{nll['mean']:.3f} ± {nll['se']:.3f}",
                "latent's gain": "" if gain is None else f"{gain['mean']:+.3f} ± {gain['se']:.3f} ({gain['z']:.0f} SE)",
                "seeds": s.get("seeds", 1),
                "gap to exact": "" if gap is None else f"{gap['mean']:+.3f} ± {gap['se']:.3f}",
                "non-embedding params": sizes.get(name, "")})
    return pd.DataFrame(rows)


def encoder_table(study: dict) -> pd.DataFrame:
    """What the encoder buys: its bound after k steps and the cold-start steps that match it."""
    rows = []
    for source, s in (study.get("sources") or {}).items():
        e = s["encoder_buys"]
        for init in ("authors", "prior"):
            cold = e[init]
            rows.append({"source": source, "encoder + k steps": e["steps"],
                         "bound (nats/token)": round(e["bound"], 3),
                         "ms per sequence": round(e["ms_per_sequence"], 2), "cold start": init,
                         "cold steps to match": cold["steps_to_match"] if cold["steps_to_match"]
                         is not None else f"none (best {cold['best_bound']:.3f})",
                         "cold ms per sequence": round(cold.get("ms_per_sequence", float("nan")), 2)})
    return pd.DataFrame(rows)


def inner_lr_table(study: dict) -> pd.DataFrame:
    """The latent model's inner step size per source: each candidate's pilot (the first training
    seed) with its training loss, the choice's criterion, and its scored suffix NLL, which the
    choice does not read."""
    rows = []
    for source, s in (study.get("sources") or {}).items():
        chosen = s.get("inner_lr")
        for pilot in (chosen or {}).get("pilots", []):
            rows.append({"source": source, "inner lr": pilot["lr"],
                         "training loss (chooses)": round(pilot["train_loss"], 4),
                         "suffix NLL, seed 1": round(pilot["suffix_nll"], 4),
                         "chosen": "yes" if pilot["lr"] == chosen["chosen"] else ""})
    return pd.DataFrame(rows)


def inner_lr_sentence(study: dict) -> str:
    """The step sizes chosen, one clause per source ("" when the study ran without a choice)."""
    parts = []
    for source, s in (study.get("sources") or {}).items():
        chosen = s.get("inner_lr")
        if chosen and len(chosen["pilots"]) > 1:
            losses = "/".join(f"{p['train_loss']:.3f}" for p in chosen["pilots"])
            lrs = "/".join(f"{p['lr']:g}" for p in chosen["pilots"])
            parts.append(f"{source} {chosen['chosen']:g} (of {lrs}: training loss {losses})")
    if not parts:
        return ""
    return (" The latent model's inner step size, chosen per source by the first seed's training "
            "loss (the scored sequences play no part): " + "; ".join(parts) + ".")


def published_table(study: dict) -> pd.DataFrame:
    """The latent model's numbers side by side: the bound as the LTM authors report it (q and its
    noise fitted to the scored text), the honest bound (fresh noise), IWAE K=64 and the suffix
    NLL given the prefix, nats per token, mean ± SE; optimism = honest - published, paired."""
    rows = []
    for source, s in (study.get("sources") or {}).items():
        b = s.get("published_beside_ours")
        if not b:
            continue
        for label, key in (("as the authors report it (noise reused)", "published_bound"),
                           ("honest bound (fresh noise)", "honest_bound"),
                           ("IWAE, 64 samples", "iwae_64"),
                           ("suffix given prefix (the study's score)", "suffix_given_prefix")):
            rows.append({"source": source, "number": label,
                         "nats/token": f"{b[key]['mean']:.3f} ± {b[key]['se']:.3f}",
                         "sequences": s["sequences"] if key == "suffix_given_prefix" else b["sequences"]})
        o = b["optimism"]
        rows.append({"source": source, "number": "optimism of the published bound (honest - it)",
                     "nats/token": f"{o['mean']:+.3f} ± {o['se']:.3f}", "sequences": b["sequences"]})
    return pd.DataFrame(rows)


def bound_figure(study: dict) -> Figure | None:
    """The bound NLL + KL (nats per token) and its NLL part against inference steps, one line per
    start of q, one panel per source."""
    sources = study.get("sources") or {}
    if not sources:
        return None
    fig = Figure(figsize=(5.2 * len(sources), 3.6), layout="constrained")
    axes = fig.subplots(1, len(sources), squeeze=False)[0]
    for ax, (source, s) in zip(axes, sources.items()):
        curves = pd.DataFrame(s["curves"])
        curves["x"] = curves["steps"].clip(lower=0.5)  # 0 steps on a log axis
        sns.lineplot(curves, x="x", y="bound", hue="init", palette=INIT_COLORS, marker="o", ax=ax)
        sns.lineplot(curves, x="x", y="nll", hue="init", palette=INIT_COLORS, linestyle="--",
                     ax=ax, legend=False)
        ax.set_xscale("log")
        top = min(curves["bound"].max(), curves["nll"].max() + 1.0)
        ax.set_ylim(top=top)
        note_off_scale(ax, curves, top)
        ax.set_xlabel("inference steps (0 drawn at 0.5)")
        ax.set_ylabel("nats per token: bound (solid), its NLL (dashed)")
        ax.set_title(f"{source}: the bound by inference steps")
        ax.grid(alpha=0.3)
    return fig


def note_off_scale(ax, curves: pd.DataFrame, top: float) -> None:
    """Say on the panel which starts' bounds the y range cuts (a cold start can sit nats above
    the rest for its first steps, which would flatten every other line): where, and how high."""
    lines = []
    for init, c in curves.groupby("init", sort=False):
        cut = c[c["bound"] > top]
        if len(cut):
            steps = ", ".join(f"{n:g}" for n in cut["steps"])
            lines.append(f"{init}: bound up to {cut['bound'].max():.2f} above the scale"
                         f" (at {steps} steps)")
    if lines:
        ax.text(0.02, 0.02, "\n".join(lines), transform=ax.transAxes, fontsize=7, va="bottom",
                color="0.3")
