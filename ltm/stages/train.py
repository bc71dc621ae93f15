"""The train stage: the model of params.yaml's `model` and `train` sections trained (one run is
`ltm.train.trainer.Trainer`; its settings are `ltm.train.settings`), then its counterparts
(`ltm.train.counterpart`), and the metrics and loss curves written for DVC (`train_stage`); the
prior over latent thoughts of the `prior` section trains as soon as the latent model is trained
(on a CPU beside a model still training, if one is) and is measured after (ltm.stages.prior);
then text is sampled from the trained checkpoint with the `samples` section (`samples_stage`).
The train notebook calls them all; the latent study is a stage of its own (ltm.stages.study).

Every speed optimisation is a switch under `train.opt` (see `ltm.train.settings.OptConfig`); `auto`
picks per device. The data position is a micro-batch index (see ltm.data.batches), checkpoints are in
ltm.train.checkpoint.

    python -m ltm.stages.train [--params params.yaml] [--set model.mixer=deltanet ...] [--out DIR]
    torchrun --nproc_per_node=N -m ltm.stages.train [--params ...]

The command trains the model and its counterparts (`train_stage`) into runs/train/ by default
(checkpoints, train.json, train_loss.csv), never into the stage's outputs, which DVC tracks; the
stage itself also trains and measures the prior and samples text (the train notebook).
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch.distributed as dist

import pandas as pd

from ltm.data.cache import cache_dir_of
from ltm.data.corpus import DataError
from ltm.generate import SamplesConfig, write_samples
from ltm.params import ParamsError, load_section, read_params
from ltm.stages.prior import prior_quietly
from ltm.train.counterpart import side_by_side_workers, train_with_counterparts
from ltm.train.settings import TrainingDiverged, TrainResult, load_configs


def write_outputs(result: TrainResult, metrics_path: str | Path, plot_path: str | Path) -> None:
    """train.json for `dvc metrics`; the loss curves for `dvc plots`: the train rows in plot_path,
    the validation rows beside it (val_loss.csv), so each is its own series, never one line that
    jumps between them."""
    plot_path = Path(plot_path)
    for path in (Path(metrics_path), plot_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    Path(metrics_path).write_text(json.dumps(result.metrics, indent=1) + "\n")
    train = ["step,seconds,loss"] + [f"{r['step']},{r.get('seconds', '')},{r['loss']!r}"
                                     for r in result.history if r["split"] == "train"]
    plot_path.write_text("\n".join(train) + "\n")
    # the validation curve also against training seconds (evaluations left out) and tokens: the
    # axes of time to target
    val = ["step,seconds,loss,train_seconds,tokens"] + [
        f"{r['step']},{r.get('seconds', '')},{r['loss']!r},{r.get('train_seconds', '')},"
        f"{r.get('tokens', '')}" for r in result.history if r["split"] == "val"]
    val_curve_path(plot_path).write_text("\n".join(val) + "\n")
    # always written (a header alone without counterparts): an output of the stage
    rows = ["model,split,step,seconds,loss"] + [
        f"{r['model']},{r['split']},{r['step']},{r.get('seconds', '')},{r['loss']!r}"
        for r in result.compared]
    compare_curve_path(plot_path).write_text("\n".join(rows) + "\n")


def val_curve_path(plot_path: str | Path) -> Path:
    """Where write_outputs puts the validation curve: val_loss.csv beside the train curve."""
    return Path(plot_path).with_name("val_loss.csv")


def compare_curve_path(plot_path: str | Path) -> Path:
    """Where write_outputs puts every model's curves (train stage with counterparts):
    compare_loss.csv beside the train curve, rows (model, split, step, seconds, loss)."""
    return Path(plot_path).with_name("compare_loss.csv")


def train_stage(params_path: str | Path, checkpoint_dir: str | Path, metrics_path: str | Path,
                plot_path: str | Path, overrides: list[str] = (), progress: bool = True,
                prior_metrics_path: str | Path | None = None) -> TrainResult:
    """The train stage: train from params.yaml's model and train sections, then (train.counterpart)
    the plain or latent model beside it and a plain model at equal FLOPs (ltm.train.counterpart); write
    the metrics and loss curves (from the process of rank 0). Paths come from dvc.yaml. With
    prior_metrics_path, the prior (ltm.stages.prior) trains too, as soon as the latent model is
    trained: on a CPU beside a model still training, if one is; its metrics go to that path."""
    model_cfg, train_cfg, cache_dir = load_configs(params_path, overrides)
    say = print if int(os.environ.get("RANK", "0")) == 0 else (lambda *args: None)
    prior = None if prior_metrics_path is None else (
        prior_quietly, (str(params_path), str(checkpoint_dir), str(prior_metrics_path),
                        list(overrides)))
    result = train_with_counterparts(model_cfg, train_cfg, cache_dir, checkpoint_dir, progress, say,
                                     after_latent=prior)
    # how its tokens/s was measured (ltm.train.counterpart.at_once_stamp), saved with the model's
    # metrics; a checkpoint trained before the stamp existed is taken as configured now
    at_once = side_by_side_workers(train_cfg) if train_cfg.counterpart.enabled else 1
    result.metrics.setdefault("models_at_once", at_once)
    if int(os.environ.get("RANK", "0")) == 0:
        write_outputs(result, metrics_path, plot_path)
    return result


def samples_stage(params_path: str | Path, checkpoint_dir: str | Path,
                  samples_path: str | Path) -> pd.DataFrame:
    """Text sampled from the trained checkpoint with params.yaml's `samples` section, written to
    samples_path as JSON for the report (ltm.generate.write_samples); the samples as a table."""
    cfg = load_section(SamplesConfig, "samples", params_path)
    cache_dir = cache_dir_of(read_params(params_path))
    return pd.DataFrame(write_samples(cfg, checkpoint_dir, cache_dir, samples_path))


# where `python -m ltm.stages.train` writes unless told: outside every DVC output (git-ignored)
DEFAULT_OUT = "runs/train"


def main() -> None:
    parser = argparse.ArgumentParser(description="Train an LTM from a params file.")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one parameter, e.g. --set model.mixer=deltanet")
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help=f"folder of the run: checkpoints, train.json, train_loss.csv "
                             f"(default {DEFAULT_OUT}; the stage's own outputs stay DVC's)")
    parser.add_argument("--out-dir", help="checkpoint folder (default: OUT/checkpoints)")
    parser.add_argument("--metrics", help="metrics JSON (default: OUT/train.json)")
    parser.add_argument("--plot", help="loss-curve CSV (default: OUT/train_loss.csv)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    args = parser.parse_args()
    try:
        out = Path(args.out)
        train_stage(args.params, checkpoint_dir=args.out_dir or str(out / "checkpoints"),
                    metrics_path=args.metrics or str(out / "train.json"),
                    plot_path=args.plot or str(out / "train_loss.csv"),
                    overrides=args.set, progress=not args.no_progress)
    except Exception as err:  # one line for the user: the traceback is behind --debug
        if args.debug:
            raise
        raise SystemExit(f"error: {one_line(err)}") from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def one_line(err: Exception) -> str:
    """A user error's message; anything else (a bug) with its type and a pointer to --debug."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    if isinstance(err, (ParamsError, DataError, TrainingDiverged)):
        return " ".join(lines)
    return f"{type(err).__name__}: {lines[0] if lines else ''} (run with --debug for the traceback)"


if __name__ == "__main__":
    main()
