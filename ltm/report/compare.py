"""This run beside the last commit and each `dvc exp` run: the report's summary.

The metrics files are small and kept in git, so the last commit's are `git show HEAD:<path>` and
an experiment's are `git show <its ref>:<path>` (DVC keeps each experiment as a commit under
refs/exps). Git is read directly: the report stage runs inside `dvc repro`, which holds DVC's lock.

Whether a change is real is decided here, not by DVC: a metric's noise is measured by the stage
that wrote it (`<metric>_noise` beside it: the standard error of the validation loss over its
batches, the spread of tokens/s over the timed windows), and a change counts only when it exceeds
twice the combined noise of both runs.
"""
from __future__ import annotations

import json
import math
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

# a change counts when |change| > NOISE_SIGMAS * sqrt(noise_a^2 + noise_b^2)
NOISE_SIGMAS = 2.0


@dataclass(frozen=True)
class Headline:
    file: str  # metrics file name under the metrics folder
    key: str  # dotted key inside it
    label: str
    higher_is_better: bool
    # a dotted key of how the value was measured: two runs that differ in it are not compared
    # (missing = `usual`, the value every run had before the key existed)
    condition: str | None = None
    usual: object = None


# from the train stage's headline metrics (ltm.stages.summary): a plain model has val_nll, a
# latent one the bound val_nll_bound, never both; then the verdicts of the study and the recall
# stage (their noise: the standard error over sequences and training seeds), so that a change to
# either shows on the first screen. "better" is the latent model's or the memory's side winning.
HEADLINES = (
    Headline("train.json", "lm.val_nll", "validation NLL (nats/token)", False),
    Headline("train.json", "lm.val_nll_bound", "validation NLL bound, NLL + KL (nats/token)", False),
    Headline("train.json", "lm.val_prefix_nll", "second-half NLL given the first half", False),
    Headline("train.json", "lm.tokens_per_s", "training tokens/s", True, "lm.models_at_once", 1),
    Headline("train.json", "lm.peak_memory_mib", "peak memory (MiB)", False),
    Headline("study.json", "testbed.latent_gain_over_plain",
             "study, testbed: latent gain over plain (nats/token)", True),
    Headline("study.json", "corpus.latent_gain_over_plain",
             "study, corpus: latent gain over plain (nats/token)", True),
    Headline("recall.json", "recall_margin_over_sliding_window.titans:window.difference",
             "recall: Titans margin over sliding window", True),
)


def git(*args: str, cwd: str | Path = ".") -> str | None:
    """stdout of a git command, or None where git or the object is missing."""
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def lookup(metrics: dict | None, dotted: str):
    value = metrics
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def git_path(path: Path) -> str:
    """`path` as `git show REV:<it>` reads it: relative to the working directory ("./..."),
    which is where the stages run."""
    if path.is_absolute():
        try:
            path = path.relative_to(Path.cwd())
        except ValueError:
            return path.as_posix()  # outside the repository: git finds nothing there
    return f"./{path.as_posix()}"


def metrics_at(revision: str | None, metrics_dir: Path) -> dict[str, dict]:
    """{file name: metrics} of every headline file, in the workspace (revision None) or at a
    git revision; a file that is not there is left out."""
    found = {}
    for name in sorted({h.file for h in HEADLINES}):
        path = metrics_dir / name
        if revision is None:
            text = path.read_text() if path.is_file() else None
        else:
            text = git("show", f"{revision}:{git_path(path)}")
        if text:
            try:
                found[name] = json.loads(text)
            except ValueError:
                continue  # a half-written or foreign file at that revision: not comparable
    return found


def experiment_refs() -> list[tuple[str, str]]:
    """(name, ref) of each `dvc exp` run kept in this repository, newest first."""
    out = git("for-each-ref", "--sort=-committerdate", "--format=%(refname)", "refs/exps") or ""
    return [(ref.rsplit("/", 1)[-1], ref) for ref in out.split() if ref.count("/") >= 3]


def is_change(delta: float, noise: list[float | None]) -> bool | None:
    """True / False when the noise of both runs is known, None when it is not measured."""
    if any(n is None or not math.isfinite(n) for n in noise):
        return None
    return abs(delta) > NOISE_SIGMAS * math.hypot(*noise)


def _verdict(h: Headline, now: float, then: float, change: bool | None) -> str:
    if change is None:
        return "noise not measured"
    if not change:
        return "within noise"
    better = (now > then) == h.higher_is_better
    return "better" if better else "worse"


def _unlike(h: Headline, now: dict | None, then: dict | None) -> str | None:
    """Why two runs' values of `h` do not compare (measured under other conditions), or None."""
    if h.condition is None:
        return None
    here, there = (lookup(m, h.condition) for m in (now, then))
    here, there = (h.usual if x is None else x for x in (here, there))
    if here == there:
        return None
    return f"not compared: {h.condition.rsplit('.', 1)[-1]} {here} here, {there} then"


def summary_table(current: dict[str, dict], others: dict[str, dict[str, dict]]) -> pd.DataFrame:
    """One row per headline metric and compared run: this run's value, theirs, the change and
    whether it exceeds the noise. `others`: {run name: metrics_at(...)}."""
    rows = []
    for h in HEADLINES:
        now = lookup(current.get(h.file), h.key)
        if not isinstance(now, (int, float)):
            continue
        now_noise = lookup(current.get(h.file), f"{h.key}_noise")
        for run, metrics in others.items():
            then = lookup(metrics.get(h.file), h.key)
            if not isinstance(then, (int, float)):
                rows.append({"metric": h.label, "compared with": run, "this run": now,
                             "then": None, "change": None, "verdict": "not measured then"})
                continue
            unlike = _unlike(h, current.get(h.file), metrics.get(h.file))
            if unlike:
                rows.append({"metric": h.label, "compared with": run, "this run": now,
                             "then": then, "change": None, "verdict": unlike})
                continue
            change = is_change(now - then, [now_noise, lookup(metrics.get(h.file), f"{h.key}_noise")])
            rows.append({"metric": h.label, "compared with": run, "this run": now, "then": then,
                         "change": now - then, "verdict": _verdict(h, now, then, change)})
    return pd.DataFrame(rows, columns=["metric", "compared with", "this run", "then", "change",
                                       "verdict"])


def flatten(mapping: dict, prefix: str = "") -> dict[str, object]:
    flat = {}
    for key, value in (mapping or {}).items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def changed_params(params_path: Path, revision: str = "HEAD") -> pd.DataFrame:
    """Every parameter whose value in the workspace differs from `revision`'s params.yaml."""
    then_text = git("show", f"{revision}:{git_path(params_path)}")
    now = flatten(yaml.safe_load(params_path.read_text()) or {})
    then = flatten(yaml.safe_load(then_text) or {}) if then_text else {}
    rows = [{"parameter": key, revision: then.get(key), "this run": now.get(key)}
            for key in sorted(set(now) | set(then)) if now.get(key) != then.get(key)]
    return pd.DataFrame(rows, columns=["parameter", revision, "this run"])


def workspace_state(outputs: tuple[str, ...] = ("reports/", "dvc.lock")) -> dict:
    """The commit and whether tracked files other than the pipeline's outputs differ from it."""
    commit = (git("rev-parse", "--short", "HEAD") or "unknown").strip()
    status = git("status", "--porcelain", "--untracked-files=no") or ""
    changed = [line[3:] for line in status.splitlines() if not line[3:].startswith(outputs)]
    return {"commit": commit, "dirty": bool(changed), "changed_files": changed}
