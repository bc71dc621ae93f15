"""Tiny corpora for the tests: random-word documents (cache and tokenize tests), and a corpus with
its token cache and the train stage's checkpoint of a tiny model (ablate protocol and stage)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ltm.data.cache import DataConfig, build_cache
from ltm.train.settings import load_configs
from ltm.train.trainer import run_training

# the tiny model and training of the ablate tests, and their few, short measurements
TINY = {"model": {"n_layers": 1, "d_model": 32, "n_heads": 2, "max_seq_len": 32},
        "train": {"batch_size": 4, "seq_len": 32, "warmup_steps": 2, "eval_batches": 1}}
QUICK = dict(warmup=1, steps=2, repeats=2, val_sequences=8, profile_steps=0, warm_start_steps=30)


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


def write_documents(root: Path) -> Path:
    """Twelve text documents of random words (a fresh draw each run) under root: a corpus for the
    cache and tokenize tests."""
    rng = np.random.default_rng()
    words = ["king", "queen", "crown", "sword", "night", "love", "death", "the", "of", "and"]
    for i in range(12):
        text = " ".join(rng.choice(words, size=400 + 37 * i))
        (root / f"doc{i:02d}.txt").write_text(f"Document {i}.\n{text}\n")
    return root
