"""The ablate stage: flip one switch at a time on top of the baseline (the model and train
sections of params.yaml), train each variant for the same number of steps, and measure what it
buys in tokens/s and what it costs in validation loss."""
from __future__ import annotations

import copy
import json
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ltm.cache import cache_dir_of
from ltm.model import ModelConfig
from ltm.params import ParamsError, apply_override, check, from_mapping, load_section, read_params
from ltm.train import TrainConfig, run_training

# sections a switch may change
SWITCHABLE = ("model", "train")


@dataclass
class AblateConfig:
    steps: int = 30  # training steps of every run, the baseline's included
    repeats: int = 2  # runs per variant; tokens/s is their median
    # a variant preserves quality when its val loss is within this of the baseline's
    loss_tolerance: float = 0.05
    # each entry, one or more space-separated "section.key=value", is applied alone on top of
    # the baseline
    switches: list[str] = field(default_factory=lambda: [
        "train.opt.pretokenized=false", "train.opt.fused_loss=true", "model.checkpointing=true",
        "model.mixer=deltanet", "model.mixer=deltanet model.kernel=naive"])

    def __post_init__(self) -> None:
        check(self.steps > 0, "steps", f"must be > 0, got {self.steps}")
        check(self.repeats > 0, "repeats", f"must be > 0, got {self.repeats}")


def apply_switch(sections: dict, switch: str, where: str) -> dict:
    """A deep copy of `sections` with the switch's assignments applied. A switch is one or more
    space-separated 'section.key=value' assignments in the model or train section."""
    changed = copy.deepcopy(sections)
    for assignment in switch.split():
        if assignment.partition(".")[0] not in SWITCHABLE:
            raise ParamsError(f"{where}: '{assignment}' must change the model or train section")
        apply_override(changed, assignment, where)
    return changed


def variant_configs(sections: dict, steps: int, where: str) -> tuple[ModelConfig, TrainConfig]:
    """Validated configs of one variant, trained for `steps` steps from scratch."""
    train = dict(sections.get("train") or {}, steps=steps, resume=False)
    model_cfg = from_mapping(ModelConfig, sections.get("model"), f"{where} model")
    train_cfg = from_mapping(TrainConfig, train, f"{where} train")
    return model_cfg, train_cfg


def run_variant(sections: dict, steps: int, cache_dir: str, where: str) -> dict:
    """tokens/s, val loss and peak memory of one training run of the variant."""
    model_cfg, train_cfg = variant_configs(sections, steps, where)
    with tempfile.TemporaryDirectory() as out_dir:
        metrics = run_training(model_cfg, train_cfg, cache_dir, out_dir, progress=False).metrics
    return {"tokens_per_s": metrics["tokens_per_s"], "val_loss": metrics["val_loss"],
            "peak_memory_mib": metrics.get("peak_memory_mib")}


def ablate(cfg: AblateConfig, sections: dict, cache_dir: str) -> pd.DataFrame:
    """One row per variant: the baseline first, then each switch alone. tokens/s and val loss are
    medians over `repeats` rounds."""
    variants = [("baseline", sections)]
    for i, text in enumerate(cfg.switches):
        where = f"ablate.switches[{i}]"
        variants.append((text, apply_switch(sections, text, where)))
        # fail on a bad switch before spending minutes on the ones before it
        variant_configs(variants[-1][1], cfg.steps, where)
    # the first run in a process pays one-time costs (thread pools, allocator, lazy imports) that
    # made the baseline look 30% slower than the same configuration run later; a short untimed
    # run absorbs them
    print("ablate: warm-up", flush=True)
    run_variant(sections, min(cfg.steps, 5), cache_dir, "baseline")
    runs: dict[str, list[dict]] = {name: [] for name, _ in variants}
    # rounds run every variant once, so slow drift (heat, other load) hits all of them alike
    for round_ in range(cfg.repeats):
        for name, variant in variants:
            print(f"ablate: {name} (round {round_ + 1} of {cfg.repeats})", flush=True)
            runs[name].append(run_variant(variant, cfg.steps, cache_dir, name))
    rows = [{"switch": name,
             "tokens_per_s": statistics.median(r["tokens_per_s"] for r in results),
             "val_loss": statistics.median(r["val_loss"] for r in results),
             "peak_memory_mib": results[-1]["peak_memory_mib"]} for name, results in runs.items()]
    table = pd.DataFrame(rows)
    base = table.iloc[0]
    table["speedup"] = table["tokens_per_s"] / base["tokens_per_s"]
    table["delta_val_loss"] = table["val_loss"] - base["val_loss"]
    table["quality_preserved"] = table["delta_val_loss"].abs() <= cfg.loss_tolerance
    return table


def ablate_stage(params_path: str | Path, metrics_path: str | Path,
                 plot_path: str | Path) -> pd.DataFrame:
    """The ablate stage: run every variant, write metrics (per switch) and the plot table. Paths
    come from dvc.yaml."""
    cfg = load_section(AblateConfig, "ablate", params_path)
    params = read_params(params_path)
    sections = {name: params.get(name) or {} for name in SWITCHABLE}
    table = ablate(cfg, sections, cache_dir_of(params))
    for path in (metrics_path, plot_path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    metrics = {row["switch"]: {k: v for k, v in row.items() if k != "switch"}
               for row in table.to_dict("records")}
    Path(metrics_path).write_text(json.dumps(metrics, indent=1, default=float) + "\n")
    table.to_csv(plot_path, index=False)
    return table
