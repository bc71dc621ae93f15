"""The train stage's prior over latent thoughts: trained on the posteriors of the latent model the
stage just trained (`prior_stage`, ltm.train.prior_trainer), then measured (`prior_benchmark`,
ltm.bench.prior: its samplers against N(0, I) and the plain LM). Both read the train stage's
models, so both run in that stage, from one params section:

    prior:          # the prior's training (ltm.latent.prior.PriorConfig)
      ...
      bench:        # its benchmark (ltm.bench.prior.PriorBench)

An experiment on the model reruns them with it; the benchmark stage (kernels, generation, the
inner loop), which reads no checkpoint, does not rerun.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ltm.bench.prior import PRIOR_COLUMNS, PriorBench, bench_prior
from ltm.device import device_name, resolve_device
from ltm.latent.prior import PriorConfig
from ltm.params import load_section
from ltm.train.prior_trainer import train_stage_prior
from ltm.train.settings import load_configs


@dataclass
class PriorSection(PriorConfig):
    """`prior`: the prior's training (every PriorConfig field) and `bench`, its benchmark."""

    bench: PriorBench = field(default_factory=PriorBench)

    def training(self) -> PriorConfig:
        """The training settings alone: what the prior's checkpoint is matched against on resume,
        so that a change to `bench` never retrains the prior."""
        return PriorConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(PriorConfig)})


def prior_stage(params_path: str | Path, checkpoint_dir: str | Path, metrics_path: str | Path,
                say=print, overrides: list[str] = ()) -> dict:
    """The prior of params.yaml's `prior` section for the latent model the train stage trained
    (its model and train sections with `overrides`), in checkpoint_dir/prior
    (ltm.train.prior_trainer); its metrics to metrics_path."""
    cfg = load_section(PriorSection, "prior", params_path)
    model_cfg, train_cfg, cache_dir = load_configs(params_path, overrides)
    return train_stage_prior(cfg.training(), model_cfg, train_cfg, cache_dir, checkpoint_dir,
                             metrics_path, say)


def prior_quietly(params_path: str, checkpoint_dir: str, metrics_path: str,
                  overrides: list[str] = ()) -> tuple[dict, str]:
    """prior_stage as the train stage's follow-up to its latent model (a worker's job when the
    models train side by side): its metrics, and what it said as text for the parent to say."""
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        metrics = prior_stage(params_path, checkpoint_dir, metrics_path, overrides=overrides)
    return metrics, text.getvalue()


def read_prior_metrics(metrics_path: str | Path) -> dict:
    """The prior's metrics as prior_stage wrote them (by the train stage's follow-up)."""
    return json.loads(Path(metrics_path).read_text())


def prior_benchmark(params_path: str | Path, checkpoint_dir: str | Path, metrics_path: str | Path,
                    plot_path: str | Path) -> tuple[pd.DataFrame, dict]:
    """The learned prior's benchmark (`prior.bench`, ltm.bench.prior) on the train stage's models
    in checkpoint_dir, on train.device: its metrics (metrics_path) and one row per source of z
    (plot_path, written with a header alone when skipped). Paths come from dvc.yaml."""
    cfg = load_section(PriorSection, "prior", params_path)
    _, train_cfg, _ = load_configs(params_path)
    device = resolve_device(train_cfg.device, "train.device")
    rows, metrics = bench_prior(cfg.bench, checkpoint_dir, device)
    metrics = {"device": device_name(device),
               **metrics}
    table = pd.DataFrame(rows, columns=PRIOR_COLUMNS if not rows else None)
    for path in (metrics_path, plot_path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(metrics_path).write_text(json.dumps(metrics, indent=1) + "\n")
    table.to_csv(plot_path, index=False)
    return table, metrics
