"""The report's first screen: four answers in a few lines (did latents help, which switches paid,
our kernels against the reference, what changed since the last commit), each from what a stage
wrote or a record kept in git, saying where it comes from."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ltm.bench.kernel_grid import grid_summary
from ltm.report.records import latest_grid, reference_rows, reference_summary

# the study's control that answers "did latents help" first, then the instrument's check
STUDY_HEADLINE = ("the plain model with as many parameters (equal tokens)", "z of another sequence")


def _json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def latent_line(results_dir: Path) -> str:
    study = _json(results_dir / "study.json")
    if not study or not study.get("enabled"):
        return "Latent thoughts: no study in this run (study.enabled, or the train stage did not run)."
    lines = [line for line in study.get("verdict") or []
             if any(label in line for label in STUDY_HEADLINE)]
    return "Latent thoughts (this run's study, suffix NLL, paired): " + "; ".join(lines) + "."


def switches_line(results_dir: Path) -> str:
    ablate = _json(results_dir / "ablate.json")
    if not ablate:
        return "Speed switches: the ablate stage wrote no verdicts."
    rows = {k: v for k, v in ablate.items() if isinstance(v, dict) and "verdict" in v
            and k not in ("baseline", "final")}
    by_verdict: dict[str, list[str]] = {}
    for k, v in rows.items():
        shown = f"{k} x{v['speedup']:.2f}" if v["verdict"] == "PASS" else k
        by_verdict.setdefault(v["verdict"], []).append(shown)
    device = (ablate.get("protocol") or {}).get("device", "this machine")
    others = "; ".join(f"{verdict} {', '.join(names)}" for verdict, names in by_verdict.items()
                       if verdict != "PASS")
    return (f"Speed switches ({device}, step-time speed-up of each kept change): PASS "
            f"{', '.join(by_verdict.get('PASS', [])) or 'none'}" + (f"; {others}" if others else "") + ".")


def kernels_line(bench_records: Path) -> str:
    rows = latest_grid(bench_records) if Path(bench_records).is_dir() else []
    summary = [r for r in grid_summary(rows) if r.get("geomean_x_fla")]
    if not summary:
        return "Kernels: no kernel-grid record with fla times in " + str(bench_records) + "."
    devices = sorted({str(r.get("device")) for r in rows if r.get("device")})
    parts = [f"{r['op']} {r['pass']} {r['geomean_x_fla']:.2f}x (worst {r['worst_x_fla']:.2f}x at "
             f"{r['worst_shape']})" for r in summary]
    return (f"Kernels against fla's Triton path (recorded on {', '.join(devices) or 'a GPU'}; fla "
            "time / ours, geometric mean over the grid): " + "; ".join(parts) + ". "
            + references_line(Path(bench_records) / "references"))


def references_line(folder: Path) -> str:
    """Ours against the fastest fla path as installed (FlashQLA, TileLang), per op and pass, at the
    newest commit measured (`reference_summary`'s first row of each)."""
    summary = reference_summary(reference_rows(folder))
    if summary.empty:
        return "Not yet against fla with its FlashQLA and TileLang backends."
    newest = summary.groupby(["op", "pass"], sort=False).head(1)
    parts = [f"{r['op']} {r['pass']} worst {r['worst x_best']:.2f}x at {r['worst shape']} "
             f"(geomean {r['geomean x_best']:.2f}x over {r['shapes']}; {r['device']}, "
             f"{r['commit']})"
             for _, r in newest.iterrows() if r["worst x_best"] == r["worst x_best"]]
    return ("Against fla as installed with FlashQLA and TileLang (the fastest fla path per shape, "
            "few shapes so far, the newest commit measured): " + "; ".join(parts) + ".")


def changed_line(summary: pd.DataFrame) -> str:
    """What moved beyond its noise against the last commit and against each `dvc exp` run."""
    if summary.empty:
        return "What changed: nothing to compare (no earlier metrics)."
    parts = []
    for other, rows in summary.groupby("compared with", sort=False):
        # a metric measured otherwise then (compare.Headline.condition) is said apart, not counted
        apart = rows[rows["verdict"].astype(str).str.startswith("not compared")]
        rows = rows.drop(apart.index)
        moved = rows[rows["verdict"].astype(str).str.contains("better|worse", case=False)]
        parts.append(f"against {other}: " + ("; ".join(f"{r['metric']} {r['verdict']}" for _, r in moved.iterrows())
                                             if not moved.empty else
                                             f"none of {len(rows)} headline metrics beyond their noise")
                     + "".join(f"; {r['metric']} {r['verdict']}" for _, r in apart.iterrows()))
    if not any(p.startswith("against last commit") for p in parts):
        parts.insert(0, "the last commit has no metrics to compare with")
    return "What changed: " + "; ".join(parts) + "."


def headline(results_dir: Path, bench_records: Path, summary: pd.DataFrame) -> list[str]:
    """The first screen's four lines."""
    return [latent_line(Path(results_dir)), switches_line(Path(results_dir)),
            kernels_line(Path(bench_records)), changed_line(summary)]
