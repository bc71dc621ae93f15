"""A tiny corpus, its token cache and the train stage's checkpoint of a tiny model, shared by the
ablate protocol's tests and the ablate stage's."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ltm.data.cache import DataConfig, build_cache
from ltm.train.settings import load_configs
from ltm.train.trainer import run_training


def cache_and_checkpoint(root: Path, sections: dict) -> Path:
    """Under root: sonnet*.txt, their token cache (cache/) and a 30-step checkpoint (checkpoints/)
    of the model and train `sections`."""
    rng = np.random.default_rng(0)
    words = ["thou", "art", "more", "lovely", "and", "temperate", "rough", "winds", "do", "shake"]
    for i in range(6):
        (root / f"sonnet{i}.txt").write_text(" ".join(rng.choice(words, size=3000)))
    cfg = DataConfig(source=str(root), vocab_size=300, val_fraction=0.3, cache_dir=str(root / "cache"))
    build_cache(cfg, progress=False)
    params = root / "params.yaml"
    params.write_text(json.dumps({"data": {"cache_dir": str(root / "cache")}, **sections}))
    model_cfg, train_cfg, cache_dir = load_configs(params, ["train.steps=30", "train.eval_every=30"])
    run_training(model_cfg, train_cfg, cache_dir, str(root / "checkpoints"), progress=False)
    return root
