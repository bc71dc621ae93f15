"""The tokenize stage: the token cache (ltm.data.cache) built from params.yaml's `data` section, and
its metrics (documents, bytes and tokens per split, the tokenizer's size; for data.source synthetic
also the exact entropies of the validation split and the synthetic parameters) written for DVC.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ltm.data.cache import DataConfig, build_cache, read_meta
from ltm.params import load_section


def tokenize_stage(params_path: str | Path, metrics_path: str | Path) -> tuple[dict, pd.DataFrame]:
    """The tokenize-cache stage: build the cache from the `data` section, write its metrics.
    Returns the metrics and a table of the splits (documents, bytes, tokens, shards)."""
    cfg = load_section(DataConfig, "data", params_path)
    metrics = build_cache(cfg)
    Path(metrics_path).parent.mkdir(parents=True, exist_ok=True)
    Path(metrics_path).write_text(json.dumps(metrics, indent=1) + "\n")
    works = f" ({metrics['works']} works)" if "works" in metrics else ""
    print(f"tokenized {metrics.get('documents', '?')} documents{works}: {metrics.get('tokens', 0):,} tokens, "
          f"vocabulary {metrics.get('vocab_size', '?')} -> {cfg.cache_dir}")
    splits = pd.DataFrame([{"split": name, "documents": split["documents"],
                            "works": split.get("works"), "bytes": split["bytes"],
                            "tokens": split["tokens"], "shards": len(split["shards"])}
                           for name, split in read_meta(cfg.cache_dir)["splits"].items()])
    return metrics, splits
