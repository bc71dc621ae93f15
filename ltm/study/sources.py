"""What the study trains on and scores: the Markov-chain testbed (data.synthetic, its exact
likelihood known) or the configured token cache. Both give the same thing, a `StudySource`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ltm.data.cache import DataConfig, TokenCache
from ltm.data.synthetic import (generate_split, make_chains, suffix_log_likelihood,
                                windowed_suffix_log_likelihood)
from ltm.study.settings import StudyConfig

# (batch_size, generator) -> x, y (B, T) int64: a training batch
Sampler = Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]


class RowSampler:
    """Training batches of whole rows (N, L + 1) drawn with replacement: x = row[:-1], y =
    row[1:]. A class, not a closure, so that a source travels to a worker process."""

    def __init__(self, rows: torch.Tensor) -> None:
        self.rows = rows

    def __call__(self, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        picked = self.rows[torch.randint(len(self.rows), (batch_size,), generator=generator)]
        return picked[:, :-1], picked[:, 1:]


class CacheSampler:
    """Random training windows of seq_len tokens from a token cache's train split; the cache is
    opened on first use (in the process that samples: a memory map does not travel)."""

    def __init__(self, cache_dir: str, seq_len: int) -> None:
        self.cache_dir, self.seq_len = cache_dir, seq_len
        self._train: TokenCache | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_train": None}

    def __call__(self, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        if self._train is None:
            self._train = TokenCache(self.cache_dir, "train")
        return self._train.sample_batch(batch_size, self.seq_len, generator)


@dataclass
class StudySource:
    """name; vocab_size; sample (training batches); val_x, val_y (N, T) the scored sequences,
    whose second half (targets T // 2 ..) is the suffix scored given the first; exact (N,) the
    true -log p(suffix | prefix) per token of each, or None; floor (N,) the same for the best
    predictor that sees only the study decoder's receptive field, or None."""

    name: str
    vocab_size: int
    sample: Sampler
    val_x: torch.Tensor
    val_y: torch.Tensor
    exact: np.ndarray | None = None
    floor: np.ndarray | None = None

    @property
    def prefix_len(self) -> int:
        return self.val_y.shape[1] // 2


def receptive_field(cfg: StudyConfig) -> int:
    """Input tokens a study decoder's prediction can see: each layer reaches window - 1 back."""
    return cfg.n_layers * (cfg.window - 1) + 1


def _with_end_of_text(tokens: np.ndarray, eot: int) -> torch.Tensor:
    """Rows (N, L) -> (N, L + 1): end-of-text, then the symbols; a window x = row[:-1], y = row[1:]
    predicts all L symbols, the first from end-of-text alone (as the aligned cache lays them)."""
    return torch.from_numpy(np.concatenate([np.full((len(tokens), 1), eot), tokens], 1))


def synthetic_source(data: DataConfig, cfg: StudyConfig) -> StudySource:
    """The testbed of data.synthetic under data.seed, drawn here (no cache needed): symbols
    0..V-1, end-of-text V."""
    syn = data.synthetic
    train, _ = generate_split(syn, data.seed, "train")
    val, _ = generate_split(syn, data.seed, "val")
    val = val[:cfg.val_sequences]
    eot, prefix = syn.symbols, syn.length // 2
    val_rows = _with_end_of_text(val, eot)
    chains = make_chains(syn, data.seed)
    suffix_tokens = syn.length - prefix
    exact = -suffix_log_likelihood(chains, val, prefix) / suffix_tokens
    floor = -windowed_suffix_log_likelihood(chains, val, prefix, receptive_field(cfg)) / suffix_tokens
    return StudySource("testbed", syn.symbols + 1, RowSampler(_with_end_of_text(train, eot)),
                       val_rows[:, :-1], val_rows[:, 1:], exact, floor)


def corpus_source(cache_dir: str, vocab_size: int, cfg: StudyConfig) -> StudySource:
    """The token cache: random training windows of cfg.seq_len, the first val_sequences
    validation windows scored."""
    val = TokenCache(cache_dir, "val")
    xs, ys, held = [], [], 0
    for x, y in val.eval_batches(64, cfg.seq_len):
        xs.append(x), ys.append(y)
        held += len(x)
        if held >= cfg.val_sequences:
            break
    val_x, val_y = torch.cat(xs)[:cfg.val_sequences], torch.cat(ys)[:cfg.val_sequences]
    return StudySource("corpus", vocab_size, CacheSampler(cache_dir, cfg.seq_len), val_x, val_y)
