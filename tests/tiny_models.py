"""Tiny float32 models of every mixer, shared by the decoding and generation tests."""
from __future__ import annotations

import torch

from ltm.model.config import ModelConfig
from ltm.model.lm import LTM

VOCAB = 37
MIXERS = {
    "attention": dict(mixer="attention", n_heads=2),
    "attention-window": dict(mixer="attention", n_heads=2, window=4),
    "rwkv7": dict(mixer="rwkv7"),
    "deltanet": dict(mixer="deltanet"),
    "deltanet-hier": dict(mixer="deltanet", hierarchical=True),
}


def tiny(settings: dict, seed: int = 0, **overrides) -> LTM:
    """A 2-layer float32 model, perturbed so that zero-initialised parameters take part."""
    torch.manual_seed(seed)
    fields = dict(vocab_size=VOCAB, n_layers=2, d_model=24, n_heads=3, d_ff=40, max_seq_len=48,
                  chunk_size=8, kernel="torch")
    model = LTM(ModelConfig(**{**fields, **settings, **overrides}))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()
