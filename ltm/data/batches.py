"""Training batches: where they come from (token cache, raw text or random tokens) and how
micro-batch i is drawn, so that the data position is a single index.

A step's batch is drawn row by row, row j of step s from a generator seeded by (seed, s, j). The
data position is therefore just the micro-batch index: it survives a restart, worker processes
can prepare any batch in any order, and N processes that split a global batch see the same rows
as one process that takes it whole.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from ltm.data.cache import SPLITS, RawTextSampler, TokenCache, cache_fingerprint, read_meta, verify_cache
from ltm.model.lm import ModelConfig
from ltm.params import ParamsError


class SyntheticTokens:
    """Uniform random tokens, for throughput runs where no corpus is at hand."""

    def __init__(self, vocab_size: int, seed: int) -> None:
        self.vocab_size, self.seed = vocab_size, seed

    def sample_batch(self, batch_size: int, seq_len: int, generator: torch.Generator | None = None):
        tokens = torch.randint(self.vocab_size, (batch_size, seq_len + 1), generator=generator)
        return tokens[:, :-1], tokens[:, 1:]

    def eval_batches(self, batch_size: int, seq_len: int, max_batches: int):
        generator = torch.Generator().manual_seed(self.seed + 1)
        for _ in range(max_batches):
            yield self.sample_batch(batch_size, seq_len, generator)


class MicroBatches(torch.utils.data.Dataset):
    """Item i = this process's rows of micro-batch i (micro-step i % grad_accum of optimiser step
    i // grad_accum). Row j of a step's global batch, (grad_accum * world * batch_size) rows,
    comes from its own generator, so the split of a step's rows over micro-steps and processes
    does not change which rows the step trains on. Opens its source lazily, so that worker
    processes open their own memmaps instead of receiving copies."""

    def __init__(self, source: str, cache_dir: str, vocab_size: int, seed: int, seq_len: int,
                 batch_size: int, grad_accum: int, rank: int, world: int) -> None:
        self.source, self.cache_dir, self.vocab_size = source, cache_dir, vocab_size
        self.seed, self.seq_len, self.batch_size = seed, seq_len, batch_size
        self.grad_accum, self.rank, self.world = grad_accum, rank, world
        self.sampler = None

    def __len__(self) -> int:
        # endless: the sampler given to the DataLoader decides which indices are drawn
        return 2**62

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sampler is None:
            self.sampler = open_source(self.source, self.cache_dir, "train", self.vocab_size, self.seed)
        step, micro = divmod(index, self.grad_accum)
        first = (micro * self.world + self.rank) * self.batch_size
        rows = [self.sampler.sample_batch(1, self.seq_len, row_generator(self.seed, step, row))
                for row in range(first, first + self.batch_size)]
        return torch.cat([x for x, _ in rows]), torch.cat([y for _, y in rows])  # (B, T) each


def row_generator(seed: int, step: int, row: int) -> torch.Generator:
    """The generator of row `row` of optimiser step `step`: a hash of all three, not a sum, so
    that no two rows of a run share a stream."""
    state = np.random.SeedSequence([seed, step, row]).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


def open_source(source: str, cache_dir: str, split: str, vocab_size: int, seed: int):
    """source: cache (token cache), raw (tokenise raw text per batch) or synthetic."""
    if source == "synthetic":
        return SyntheticTokens(vocab_size, seed)
    if source == "raw":
        return RawTextSampler(cache_dir, split)
    return TokenCache(cache_dir, split, verify=False)


def with_vocab(model_cfg: ModelConfig, cache_dir: str, source: str) -> ModelConfig:
    """model_cfg with vocab_size taken from the token cache when it is 0."""
    if source == "synthetic":
        if model_cfg.vocab_size <= 0:
            raise ParamsError("model.vocab_size: must be set (> 0) when train.data is synthetic")
        return model_cfg
    cache_vocab = read_meta(cache_dir)["vocab_size"]
    if model_cfg.vocab_size == 0:
        return dataclasses.replace(model_cfg, vocab_size=cache_vocab)
    if model_cfg.vocab_size < cache_vocab:
        raise ParamsError(f"model.vocab_size: {model_cfg.vocab_size} is smaller than the "
                          f"tokenizer's {cache_vocab}; set it to 0 to take the tokenizer's")
    return model_cfg


def check_lengths(model_cfg: ModelConfig, seq_len: int) -> None:
    """train.seq_len against model.max_seq_len, before a model is built (the forward pass would
    fail on it only after building, compiling and probing the batch size)."""
    if seq_len > model_cfg.max_seq_len:
        raise ParamsError(f"train.seq_len: {seq_len} is longer than "
                          f"model.max_seq_len={model_cfg.max_seq_len}")


def check_data(source: str, cache_dir: str, seq_len: int, stamp_path: str | Path) -> str:
    """Before training: the token cache checked against its meta.json (in full once, then by
    size and mtime: see verify_cache) and each split long enough for one window of seq_len; a
    sequence-aligned cache (data.source synthetic) needs seq_len equal to its sequence length
    (a ParamsError naming both) and pretokenized windows. Returns the fingerprint of the data,
    which a checkpoint must match to be resumed."""
    if source == "synthetic":
        return "synthetic"  # random tokens: the seed and vocab_size, in the configs, decide them
    verify_cache(cache_dir, stamp_path)
    if source == "raw" and read_meta(cache_dir).get("sequence_length") is not None:
        raise ParamsError("train.opt.pretokenized: false cuts random spans of raw text, which do "
                          "not line up with the sequences of data.source synthetic; set it to true")
    for split in SPLITS:
        # validation reads the token cache even when training tokenises raw text
        data = (RawTextSampler(cache_dir, split) if source == "raw" and split == "train"
                else TokenCache(cache_dir, split, verify=False))
        data.check_length(seq_len)
    return cache_fingerprint(cache_dir)


def resolve_data(data: str, cache_dir: str, say=print) -> str:
    """train.data auto: cache when cache_dir holds a token cache (its meta.json), else synthetic."""
    if data != "auto":
        return data
    found = (Path(cache_dir) / "meta.json").is_file()
    say(f"train.data auto: the token cache in {cache_dir}" if found else
        f"train.data auto: no token cache in {cache_dir}: random tokens (throughput only)")
    return "cache" if found else "synthetic"
