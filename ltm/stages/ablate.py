"""The ablate stage: the protocol of ltm.ablation.protocol (one change at a time against the trained
model, kept only if the quality holds and the step is faster beyond the noise) on params.yaml's
model and train sections, with the settings of its `ablate` section.
"""
from __future__ import annotations

import time
from pathlib import Path

from ltm.ablation.protocol import Ablation, ablate, write_outputs
from ltm.ablation.switches import SWITCHABLE, AblateConfig
from ltm.data.cache import cache_dir_of
from ltm.params import load_section, read_params


def ablate_stage(params_path: str | Path, metrics_path: str | Path, plot_path: str | Path,
                 checkpoint_dir: str | Path | None = None) -> Ablation:
    """The ablate stage: the protocol on params.yaml's model and train sections, from the train
    stage's checkpoint in checkpoint_dir (None or none there: a warm start). Paths come from
    dvc.yaml."""
    cfg = load_section(AblateConfig, "ablate", params_path)
    params = read_params(params_path)
    sections = {name: params.get(name) or {} for name in SWITCHABLE}
    deadline = None if cfg.time_budget_s is None else time.monotonic() + cfg.time_budget_s
    result = ablate(cfg, sections, cache_dir_of(params), checkpoint_dir, deadline=deadline)
    write_outputs(result, metrics_path, plot_path)
    return result
