"""Recall against distance, per token mixer: which models remember a key-value pair written far
back (the multi-query associative recall task of ltm.data.recall)?

    result = bench_recall(RecallBench(), device="cpu")
    result.table   # mixer, params, bin, low, high, accuracy, se, n, correct, seeds
    result.runs    # the same per training seed: mixer, seed, params, bin, ..., n, correct
    result.curve   # mixer, seed, step, loss (training loss on the answers)

Every model in `mixers` is the same small LM (ltm.model.lm) but for its token mixer, trained from
the same initial seed on the same batches for the same steps, its loss on the answers only; and
that `seeds` times, each training seed giving every model a new initialisation and a new stream of
training batches (the held-out sequences stay the same). The
models are matched in parameter count through the MLP's width (d_ff), the one size that every
mixer has: each gets the d_ff whose count comes nearest to the largest model's at the default
width, and the table reports each count, since the match is exact only to one MLP column.

Accuracy is the share of held-out answers whose argmax is the value, per distance bin (within the
window, 1-2x, 2-4x and beyond 4x the window), averaged over the training seeds. Its standard error
adds the seeds' spread to the evaluation's sampling: sqrt(sd^2 / S + p (1 - p) / n), sd the
standard deviation of the S seeds' accuracies and n the answers scored per seed (with one seed,
the binomial term alone). Which model is initialised how moves a short run a lot (a parameter
match shifting d_ff by a few units took RWKV-7 from 0.05 to 0.13 beyond the window): one seed's
binomial error understates the noise of a comparison. A mixer entry is `model.mixer`, optionally
with options:
`attention:window` (attention over the last `window` tokens), `titans:window` (the memory beside
attention over the last `window` tokens: the issue's comparison with sliding-window attention),
`deltanet:hierarchical`.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Literal

import pandas as pd
import torch
from torch import nn
from tqdm import tqdm

from ltm.data.recall import RecallBatch, RecallTask, recall_batch
from ltm.model.lm import LTM, ModelConfig
from ltm.params import ParamsError, check
from ltm.workers import cpu_workers, run_jobs

# what may follow `mixer:` in an entry, and the model setting it turns on
OPTIONS = ("window", "hierarchical")


@dataclass
class RecallBench:
    """`recall` (the recall stage): the recall task, the models compared and their training."""

    enabled: bool = True
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: CUDA when there is one
    # the models compared: a model.mixer, with `:window` for sliding-window attention
    mixers: list[str] = field(default_factory=lambda: ["attention", "attention:window", "rwkv7",
                                                       "deltanet", "titans:window"])
    # 800 steps of 8 on a 2-core CPU: 5 models x 3 seeds in 16 minutes then, 3-4 now; 200 steps of 32 (as many
    # sequences) left every model at chance, the smaller batch lets attention start to recall
    # (LOG.md, 2026-11-27)
    steps: int = 800
    batch: int = 8
    lr: float = 3e-3
    # 128 until 2026-12-06: 0.72x the time at 96, the Titans margin 3.8 SE against 3.1 (LOG.md);
    # pairs at up to 5 windows' distance still fit
    seq_len: int = 96
    window: int = 16  # the sliding window, and the unit of the distance bins
    n_pairs: int = 8
    n_keys: int = 32
    n_values: int = 32
    eval_sequences: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    seed: int = 0
    seeds: int = 3  # training runs per model, seeds seed, seed + 1, ...: their spread is in the SE
    # models trained at once on a CPU, each in a process of its own with cores / workers threads
    # (tiny models use a second core poorly within one process); 0 = one per core; on a GPU, 1
    workers: int = 0

    def __post_init__(self) -> None:
        check(self.device in ("auto", "cpu", "cuda"), "device",
              f"expected auto, cpu or cuda, got {self.device!r}")
        check(len(self.mixers) > 0, "mixers", "must name one or more models")
        # each entry names its rows of the table: a repeat would silently be trained once
        check(len(set(self.mixers)) == len(self.mixers), "mixers",
              f"each entry once, got {self.mixers}")
        check(self.workers >= 0, "workers", f"must be >= 0 (0: one per core), got {self.workers}")
        for name in ("steps", "batch", "eval_sequences", "d_model", "n_layers", "n_heads", "seeds"):
            check(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
        try:
            self.task().check(self.window)
        except ValueError as err:
            raise ParamsError(str(err)) from None
        for entry in self.mixers:
            model_config(self, entry)  # a bad entry stops here, in one line

    def task(self) -> RecallTask:
        return RecallTask(seq_len=self.seq_len, n_pairs=self.n_pairs, n_keys=self.n_keys,
                          n_values=self.n_values)


@dataclass
class RecallResult:
    table: pd.DataFrame  # one row per mixer and distance bin, over the seeds (over_seeds)
    runs: pd.DataFrame  # one row per mixer, training seed and distance bin
    curve: pd.DataFrame  # mixer, seed, step, loss
    seconds: float  # wall time of the whole benchmark


# a training step's CPU time relative to attention's at the benchmark's defaults (one thread,
# 2026-11-29: titans 206 ms, rwkv7 198, deltanet 87, attention 53, sliding window 44): the worker
# pool starts the long runs first, so that no long run is left alone at the end
CPU_STEP_COST = {"titans": 4.0, "rwkv7": 4.0, "deltanet": 2.0}


def model_config(bench: RecallBench, entry: str, d_ff: int | None = None) -> ModelConfig:
    """The model of one `mixers` entry ("deltanet", "attention:window", ...)."""
    mixer, *options = entry.split(":")
    unknown = [o for o in options if o not in OPTIONS]
    check(not unknown, "mixers", f"{entry!r}: unknown option {':'.join(unknown)!r} "
                                 f"(options: {', '.join(OPTIONS)})")
    settings = {"window": bench.window if "window" in options else None,
                "hierarchical": "hierarchical" in options}
    if mixer == "titans" and "window" in options:
        # Titans' own attention window (model.window is plain attention's): `titans:window` is
        # the memory beside attention as narrow as the sliding-window entry's
        settings.update(window=None, titans_window=bench.window)
    try:
        return ModelConfig(vocab_size=bench.task().vocab_size, mixer=mixer, d_model=bench.d_model,
                           n_layers=bench.n_layers, n_heads=bench.n_heads, d_ff=d_ff,
                           max_seq_len=bench.seq_len, kernel="torch", **settings)
    except ParamsError as err:
        raise ParamsError(f"mixers: {entry!r}: model.{err}") from None


def _count(cfg: ModelConfig) -> int:
    with torch.device("meta"):  # counted without allocating or initialising the weights
        return LTM(cfg).num_params(non_embedding=True)


def matched_configs(bench: RecallBench) -> dict[str, ModelConfig]:
    """Each entry's model with d_ff set so that its non-embedding count comes nearest the largest
    model's at the default width. The count is linear in d_ff (3 * d_model weights per unit per
    layer), so two counts give the line."""
    base = {e: model_config(bench, e) for e in bench.mixers}
    target = max(_count(c) for c in base.values())
    out = {}
    for entry, cfg in base.items():
        one, two = (_count(dataclasses.replace(cfg, d_ff=d)) for d in (64, 128))
        slope = (two - one) / 64
        out[entry] = dataclasses.replace(cfg, d_ff=max(1, round(64 + (target - one) / slope)))
    return out


def distance_bins(window: int, seq_len: int) -> list[tuple[int, int, str]]:
    """(low, high, label): distances in low < d <= high; within the window, 1-2x, 2-4x, beyond."""
    edges = [0, window, 2 * window, 4 * window, max(seq_len, 4 * window + 1)]
    names = ["within window", "1-2x window", "2-4x window", "> 4x window"]
    return [(lo, hi, f"{lo + 1}-{hi} ({name})") for lo, hi, name in zip(edges, edges[1:], names)
            if lo < seq_len]


def _logits(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    out = model(tokens)
    return out[0] if isinstance(out, tuple) else out  # LTM returns (logits, loss)


@torch.no_grad()
def recall_accuracy(model: nn.Module, batch: RecallBatch, bins: list[tuple[int, int, str]],
                    chunk: int = 64) -> list[dict]:
    """Per distance bin: the share of the batch's answers the model's argmax gets right, its
    binomial standard error and the count. `model(tokens)` gives logits (or (logits, loss))."""
    model_device = next(model.parameters(), torch.empty(0)).device
    correct = []
    for start in range(0, len(batch.tokens), chunk):
        tokens = batch.tokens[start:start + chunk].to(model_device)
        correct.append(_logits(model, tokens).argmax(-1).cpu() == batch.targets[start:start + chunk])
    hits, dist = torch.cat(correct)[batch.mask], batch.distance[batch.mask]
    rows = []
    for lo, hi, label in bins:
        inside = (dist > lo) & (dist <= hi)
        n, k = int(inside.sum()), int(hits[inside].sum())
        p = k / n if n else math.nan
        rows.append({"bin": label, "low": lo, "high": hi, "n": n, "correct": k, "accuracy": p,
                     "se": math.sqrt(p * (1 - p) / n) if n else math.nan})
    return rows


def lr_factor(step: int, steps: int) -> float:
    """The multiple of lr at `step`: a linear warm-up over the first 10% of the steps, then a
    cosine from 1 down to 0.1."""
    warmup = max(1, steps // 10)
    if step < warmup:
        return (step + 1) / warmup
    done = min(1.0, (step - warmup) / max(1, steps - warmup))
    return 0.1 + 0.45 * (1 + math.cos(math.pi * done))


def train_recall(cfg: ModelConfig, bench: RecallBench, batches: RecallBatch, device: torch.device,
                 bar: tqdm, seed: int) -> tuple[LTM, list[float]]:
    """One model initialised from `seed` and trained on the answers of `batches` (steps x batch
    sequences, in order), AdamW with a linear warm-up over the first 10% and a cosine decay to 10%
    of lr: a short run needs the large step early and the small one late."""
    torch.manual_seed(seed)
    model = LTM(cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=bench.lr, weight_decay=0.1,
                                  betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, bench.steps))
    losses = []
    for step in range(bench.steps):
        rows = slice(step * bench.batch, (step + 1) * bench.batch)
        _, loss = model(batches.tokens[rows].to(device), batches.targets[rows].to(device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        losses.append(loss.item())
        bar.update(1)
        if step % 20 == 0:
            bar.set_postfix_str(f"loss {losses[-1]:.3f}", refresh=False)
    return model.eval(), losses


def _train_and_score(cfg: ModelConfig, bench: RecallBench, entry: str, seed: int,
                     held_out: RecallBatch, bins: list, device: torch.device,
                     bar: tqdm | None = None) -> tuple[list, list]:
    """One (mixer, seed) run: its rows per distance bin and its loss curve; `bar` advances
    step by step where the run shares the caller's process."""
    train = recall_batch(bench.task(), bench.steps * bench.batch, seed=2 * seed)
    model, losses = train_recall(cfg, bench, train, device, bar or tqdm(disable=True), seed)
    params = model.num_params(non_embedding=True)
    rows = [{"mixer": entry, "seed": seed, "params": params, **r}
            for r in recall_accuracy(model, held_out, bins)]
    curve = [{"mixer": entry, "seed": seed, "step": s, "loss": v} for s, v in enumerate(losses)]
    return rows, curve


def bench_recall(bench: RecallBench, device: torch.device | str = "cpu",
                 progress: bool = True) -> RecallResult:
    """Train and score every model of bench.mixers (see the module's docstring); progress: one
    tqdm line over all of them (off in notebooks, which would keep every update). On a CPU the
    runs go to `workers` processes at once; each run seeds itself, so the answer does not depend
    on how they are spread (up to the rounding of a different thread count)."""
    start = time.perf_counter()
    device = torch.device(device)
    configs = matched_configs(bench)
    # the held-out sequences: odd seeds; each training seed's batches: even ones
    held_out = recall_batch(bench.task(), bench.eval_sequences, seed=2 * bench.seed + 1)
    bins = distance_bins(bench.window, bench.seq_len)
    jobs = [(entry, seed) for seed in range(bench.seed, bench.seed + bench.seeds) for entry in configs]
    # run longest first; the rows and curves keep the seed-major order above
    order = sorted(jobs, key=lambda job: -CPU_STEP_COST.get(configs[job[0]].mixer, 1.0))
    workers = cpu_workers(bench.workers, len(jobs), device)
    with tqdm(total=len(jobs) * bench.steps, desc="recall", unit="step", disable=not progress) as bar:
        in_process = bar if workers == 1 else None  # a worker's bar would not reach this one
        done = run_jobs(_train_and_score, [(configs[e], bench, e, s, held_out, bins, device, in_process)
                                           for e, s in order], workers,
                        lambda i, result: bar.update(0 if in_process else bench.steps))
    done = dict(zip(order, done))
    rows = [row for job in jobs for row in done[job][0]]
    curves = [point for job in jobs for point in done[job][1]]
    runs = pd.DataFrame(rows)[["mixer", "seed", "params", "bin", "low", "high", "n", "correct"]]
    return RecallResult(over_seeds(runs, "bin"), runs, pd.DataFrame(curves),
                        time.perf_counter() - start)


def over_seeds(runs: pd.DataFrame, by: str | None) -> pd.DataFrame:
    """Per mixer (and `by`, a column of `runs`: "bin"), over the training seeds: accuracy (the
    seeds' mean), se (the seeds' spread and the evaluation's sampling; see the module's
    docstring), n and correct (summed over the seeds), seeds (their count); params and the bin's
    edges kept when grouping by bin."""
    keys = ["mixer"] + ([by] if by else [])
    per_seed = runs.groupby([*keys, "seed"], sort=False)[["correct", "n"]].sum().reset_index()
    per_seed["accuracy"] = per_seed["correct"] / per_seed["n"]
    rows = []
    for key, part in per_seed.groupby(keys, sort=False):
        p, count = float(part["accuracy"].mean()), len(part)
        spread = float(part["accuracy"].var(ddof=1)) / count if count > 1 else 0.0
        per_seed_n = float(part["n"].mean())
        rows.append({**dict(zip(keys, key if by else (key[0],))), "accuracy": p,
                     "se": math.sqrt(spread + p * (1 - p) / per_seed_n) if per_seed_n else math.nan,
                     "n": int(part["n"].sum()), "correct": int(part["correct"].sum()),
                     "seeds": count})
    out = pd.DataFrame(rows)
    if by == "bin":
        edges = runs.drop_duplicates(["mixer", "bin"])[["mixer", "bin", "params", "low", "high"]]
        out = out.merge(edges, on=["mixer", "bin"], sort=False)
        out = out[["mixer", "params", "bin", "low", "high", "accuracy", "se", "n", "correct",
                   "seeds"]]
    return out


def beyond_window(runs: pd.DataFrame, window: int) -> pd.DataFrame:
    """Per mixer, its answers at distances beyond the window pooled, over the seeds: accuracy,
    se, n, correct, seeds (see over_seeds)."""
    return over_seeds(runs[runs["low"] >= window], None)


def far_per_seed(runs: pd.DataFrame, window: int) -> pd.DataFrame:
    """Per mixer and seed, the answers beyond the window pooled: correct, n, accuracy."""
    far = runs[runs["low"] >= window].groupby(["mixer", "seed"], sort=False)[["correct", "n"]].sum()
    return far.assign(accuracy=far["correct"] / far["n"])


def margins_over_window(runs: pd.DataFrame, window: int) -> dict[str, dict]:
    """Each other `:window` model (a memory beside the same sliding window: titans:window) against
    sliding-window attention beyond the window: the mean over seeds of the paired difference
    (same seed, same held-out answers) and its SE, the differences' spread over the seeds added to
    the two evaluations' sampling."""
    far = far_per_seed(runs, window)
    accuracy = far["accuracy"].unstack("mixer")  # (seed, mixer)
    n = far["n"].groupby("mixer").mean()
    if "attention:window" not in accuracy:
        return {}
    out = {}
    for mixer in accuracy.columns:
        if not mixer.endswith(":window") or mixer == "attention:window":
            continue
        diff = accuracy[mixer] - accuracy["attention:window"]
        spread = float(diff.var(ddof=1)) / len(diff) if len(diff) > 1 else 0.0
        sampling = sum(float(accuracy[m].mean() * (1 - accuracy[m].mean()) / n[m])
                       for m in (mixer, "attention:window"))
        out[mixer] = {"difference": round(float(diff.mean()), 4),
                      "se": round(math.sqrt(spread + sampling), 4),
                      "per_seed": [round(float(d), 4) for d in diff]}
    return out


def recall_metrics(result: RecallResult, bench: RecallBench, device_name: str) -> dict:
    """The headline numbers: per mixer its parameters, its accuracy within and beyond the window
    (pooled over the bins and averaged over the seeds) with SE and each seed's, and the best model
    beyond the window; each `:window` memory's margin over sliding-window attention; the settings
    that make them."""
    table, far = result.table, beyond_window(result.runs, bench.window)
    near = table[table["high"] <= bench.window].set_index("mixer")
    best = far.loc[far["accuracy"].idxmax()]
    per_seed = far_per_seed(result.runs, bench.window)["accuracy"].round(4)
    # the training loss over each run's last 10% of steps, averaged over the seeds
    last = result.curve.groupby(["mixer", "seed"], sort=False)["loss"].apply(
        lambda v: float(v.iloc[-max(1, len(v) // 10):].mean())).groupby("mixer", sort=False).mean()
    by_mixer = {r.mixer: {"params": int(table[table.mixer == r.mixer]["params"].iloc[0]),
                          "within_window": {"accuracy": round(float(near.loc[r.mixer, "accuracy"]), 4),
                                            "se": round(float(near.loc[r.mixer, "se"]), 4)},
                          "beyond_window": {"accuracy": round(float(r.accuracy), 4),
                                            "se": round(float(r.se), 4), "n": int(r.n),
                                            "per_seed": per_seed[r.mixer].tolist()},
                          "train_loss_last10pct": round(float(last[r.mixer]), 4)}
                for r in far.itertuples()}
    return {"device": device_name, "torch": torch.__version__, "seconds": round(result.seconds, 1),
            "settings": dataclasses.asdict(bench), "chance": round(1 / bench.n_values, 4),
            "best_beyond_window": {"mixer": str(best["mixer"]),
                                   "accuracy": round(float(best["accuracy"]), 4),
                                   "se": round(float(best["se"]), 4)},
            "margins_over_sliding_window": margins_over_window(result.runs, bench.window),
            "by_mixer": by_mixer}
