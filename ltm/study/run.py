"""The latent study, end to end: for each source, train the contenders once per training seed
(ltm.study.contenders), score every one per sequence on the suffix given the prefix
(ltm.study.scores), compare each control with the latent model, paired, with standard errors over
sequences and seeds (ltm.study.verdict), and write it all to one JSON (the study stage's
study.json)."""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch

from ltm.data.cache import DataConfig, read_meta
from ltm.device import device_name, resolve_device
from ltm.params import load_section
from ltm.study.contenders import Contenders, train_sources
from ltm.study.settings import StudyConfig
from ltm.study.sources import StudySource, corpus_source, receptive_field, synthetic_source
from ltm.study.verdict import mean_se, mean_se_over_seeds, paired, paired_over_seeds, verdict

# each control, as the verdict names it
CONTROLS = {"plain": "the plain model with as many parameters (equal tokens)",
            "plain_equal_flops": "the plain model at equal training FLOPs",
            "shared": "one learned z shared by all sequences",
            "shuffled": "z of another sequence",
            "dynamic": "dynamic evaluation of the plain model"}


def published_beside_ours(bounds: dict, sequences: int, cfg: StudyConfig, suffix: dict) -> dict:
    """The latent model's numbers side by side on the curve's sequences (raw per-sequence bounds
    from ltm.study.scoring.raw_bounds): the bound as the LTM authors report it (q and its noise
    fitted to the scored text), the honest bound (fresh noise), IWAE with 64 samples, and the
    suffix NLL given the prefix (the study's score, on all scored sequences); `optimism`: honest
    - published, paired."""
    return {"sequences": sequences, "steps": cfg.inner_steps,
            "published_bound": mean_se(bounds["reused_noise"]),
            "honest_bound": mean_se(bounds["fresh_noise"]), "iwae_64": mean_se(bounds["iwae"]),
            "suffix_given_prefix": suffix,
            "optimism": paired(bounds["fresh_noise"], bounds["reused_noise"])}


def encoder_buys(curves: list[dict], inner_steps: int) -> dict:
    """The encoder + inner_steps bound and time against the fewest cold-start steps that reach it
    (None: none of the curve's counts does)."""
    ours = next(r for r in curves if r["init"] == "encoder" and r["steps"] == inner_steps)
    out = {"steps": inner_steps, "bound": ours["bound"], "ms_per_sequence": ours["ms_per_sequence"]}
    for init in ("authors", "prior"):
        reached = [r for r in curves if r["init"] == init and r["bound"] <= ours["bound"]]
        first = min(reached, key=lambda r: r["steps"]) if reached else None
        out[init] = ({"steps_to_match": first["steps"], "ms_per_sequence": first["ms_per_sequence"]}
                     if first else {"steps_to_match": None,
                                    "best_bound": min(r["bound"] for r in curves if r["init"] == init)})
    return out


def on_device(source: StudySource, device: torch.device) -> StudySource:
    """The source with its scored sequences on `device` (training batches follow them there)."""
    return dataclasses.replace(source, val_x=source.val_x.to(device), val_y=source.val_y.to(device))


def source_metrics(source: StudySource, runs: list[Contenders], cfg: StudyConfig) -> dict:
    """Everything the study says about one source from its trained contenders (one per training
    seed): the scores and gains over every seed; the curves and the published bounds of the
    first seed's latent model."""
    scores = {k: np.stack([c.scores[k] for c in runs]) for k in runs[0].scores}  # (S, N) each
    first = runs[0]
    out = {"sequences": len(source.val_x), "seeds": len(runs), "receptive_field": receptive_field(cfg),
           "device": device_name(source.val_x.device),
           "params": first.params,
           "train_loss_last10pct": {k: float(np.mean([c.train_loss[k] for c in runs]))
                                    for k in first.train_loss},
           "equal_flops_steps": first.equal_flops_steps,
           "inner_lr": first.inner_lr,
           "dynamic_evaluation": [c.dynamic or {} for c in runs],
           "suffix_nll": {k: mean_se_over_seeds(v) for k, v in scores.items()},
           "gain_over": {k: paired_over_seeds(v, scores["latent"])
                         for k, v in scores.items() if k != "latent"}}
    if source.exact is not None:
        out["suffix_nll"]["exact"] = mean_se(source.exact)
        out["suffix_nll"]["window_floor"] = mean_se(source.floor)
        out["gap_to_exact"] = {k: mean_se_over_seeds(v - source.exact) for k, v in scores.items()}
    out["curves"] = first.curves
    out["encoder_buys"] = encoder_buys(out["curves"], cfg.inner_steps)
    out["published_beside_ours"] = published_beside_ours(
        first.bounds, min(cfg.curve_sequences, len(source.val_x)), cfg, mean_se(scores["latent"][0]))
    out["verdict"] = verdict(source.name, out["gain_over"], CONTROLS)
    out["notes"] = first.notes
    return out


def run_study(cfg: StudyConfig, data: DataConfig, vocab_size: int, metrics_path: str | Path,
              progress: bool = True, say=print) -> dict:
    """The study on each of cfg.sources; writes and returns its metrics. vocab_size: the token
    cache's (the corpus source)."""
    metrics: dict = {"enabled": cfg.enabled}
    if cfg.enabled:
        torch.manual_seed(cfg.seed)
        device = resolve_device(cfg.device, "study.device")
        torch.backends.cuda.matmul.allow_tf32 = device.type == "cuda"
        builders = {"testbed": lambda: synthetic_source(data, cfg),
                    "corpus": lambda: corpus_source(data.cache_dir, vocab_size, cfg)}
        sources = [on_device(builders[name](), device) for name in cfg.sources]
        start = time.perf_counter()
        trained = train_sources(sources, cfg, progress, say)  # every source's jobs in one pool
        metrics["sources"] = {source.name: source_metrics(source, runs, cfg)
                              for source, runs in zip(sources, trained)}
        metrics["seconds"] = time.perf_counter() - start
        metrics["verdict"] = [line for s in metrics["sources"].values() for line in s["verdict"]]
    path = Path(metrics_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(metrics, indent=1, default=float))
    return metrics


def study_from_params(params_path: str | Path, metrics_path: str | Path, progress: bool = True,
                      say=print) -> dict:
    """run_study with the `study` and `data` sections of a params file (the token cache's
    vocabulary read from its meta.json when the corpus is studied)."""
    cfg = load_section(StudyConfig, "study", params_path)
    data = load_section(DataConfig, "data", params_path)
    vocab_size = read_meta(data.cache_dir)["vocab_size"] if "corpus" in cfg.sources else 0
    return run_study(cfg, data, vocab_size, metrics_path, progress, say)
