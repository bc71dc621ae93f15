"""Multi-query associative recall (MQAR, after Zoology, Arora et al. 2023): a task that only a
model that remembers can solve.

Each sequence is T tokens in T / 2 two-token slots. n_pairs slots hold a key and its value
("k v"); later, n_pairs other slots repeat each key and its value ("k v" again, the query). The
rest is filler. The model is scored only where it must recall: at each query's key, the next
token is the value written with that key `distance` tokens earlier. Every key is queried once;
keys are distinct within a sequence and values are drawn independently, so nothing but the
earlier pair tells the answer.

Where the write and its query land is uniform over the slots, so the distances span 2 .. T - 2:
a model that sees only a window of w tokens (sliding-window attention) can answer the queries
within w and must guess beyond it, while a recurrent state must hold every pair written so far.

    batch = recall_batch(RecallTask(seq_len=256, n_pairs=16), n=64, seed=0)
    batch.tokens (64, 256), batch.targets (-100 except at the answers), batch.distance (-1 there)

Token ids: fillers 0 .. n_filler - 1, keys next, values last (RecallTask.vocab_size in all).
Everything follows from the seed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ltm.model.cross_entropy import IGNORE_INDEX


@dataclass(frozen=True)
class RecallTask:
    """The shape of the task; `check` says in one line what is wrong with it."""

    seq_len: int = 256
    n_pairs: int = 16  # key-value pairs written (and queried) per sequence
    n_keys: int = 64  # key tokens to draw each sequence's distinct keys from
    n_values: int = 64  # value tokens
    n_filler: int = 4  # filler tokens between the pairs and queries, drawn uniformly

    @property
    def vocab_size(self) -> int:
        return self.n_filler + self.n_keys + self.n_values

    def check(self, window: int | None = None) -> None:
        """ValueError if the task cannot be built (or, given the window of a sliding-window
        model, if no query could lie beyond it)."""
        if self.seq_len < 4 or self.seq_len % 2:
            raise ValueError(f"seq_len: must be even and >= 4 (two-token slots), got {self.seq_len}")
        if self.n_pairs < 1:
            raise ValueError(f"n_pairs: must be >= 1, got {self.n_pairs}")
        if 2 * self.n_pairs > self.seq_len // 2:
            raise ValueError(f"n_pairs: {self.n_pairs} pairs and their queries need "
                             f"{4 * self.n_pairs} tokens, more than seq_len={self.seq_len}")
        if self.n_keys < self.n_pairs:
            raise ValueError(f"n_keys: must be >= n_pairs={self.n_pairs} (distinct keys per "
                             f"sequence), got {self.n_keys}")
        if self.n_values < 2 or self.n_filler < 1:
            raise ValueError(f"n_values must be >= 2 and n_filler >= 1, got {self.n_values} "
                             f"and {self.n_filler}")
        if window is not None and not 1 <= window < self.seq_len - 2:
            raise ValueError(f"window: must be in 1 .. seq_len - 3 = {self.seq_len - 3} so that "
                             f"some queries lie beyond it, got {window}")


@dataclass(frozen=True)
class RecallBatch:
    tokens: torch.Tensor  # (N, T) int64: the model's input
    targets: torch.Tensor  # (N, T) int64: the value at each query's key, IGNORE_INDEX elsewhere
    mask: torch.Tensor  # (N, T) bool: the scored positions (targets != IGNORE_INDEX)
    distance: torch.Tensor  # (N, T) int64: query position - its pair's key position; -1 unscored


def recall_batch(task: RecallTask, n: int, seed: int) -> RecallBatch:
    """n sequences of the task, the same for the same (task, n, seed)."""
    task.check()
    if n < 1:
        raise ValueError(f"n: must be >= 1 sequences, got {n}")
    rng = np.random.default_rng(seed)
    T, P, slots = task.seq_len, task.n_pairs, task.seq_len // 2
    rows = np.arange(n)[:, None]
    # 2P distinct slots per sequence in random order (the first columns of a random permutation);
    # pairing the first P with the next P and writing at the earlier of the two makes every
    # (write, query) placement equally likely
    chosen = rng.random((n, slots)).argsort(axis=1)[:, :2 * P]
    write = np.minimum(chosen[:, :P], chosen[:, P:])
    query = np.maximum(chosen[:, :P], chosen[:, P:])
    keys = rng.random((n, task.n_keys)).argsort(axis=1)[:, :P] + task.n_filler
    values = rng.integers(task.n_values, size=(n, P)) + task.n_filler + task.n_keys
    tokens = rng.integers(task.n_filler, size=(n, T))
    for slot in (write, query):
        tokens[rows, 2 * slot] = keys
        tokens[rows, 2 * slot + 1] = values
    # the logits at the query's key predict the next token: the value
    targets = np.full((n, T), IGNORE_INDEX)
    targets[rows, 2 * query] = values
    distance = np.full((n, T), -1)
    distance[rows, 2 * query] = 2 * (query - write)
    targets_t = torch.from_numpy(targets)
    return RecallBatch(torch.from_numpy(tokens), targets_t, targets_t != IGNORE_INDEX,
                       torch.from_numpy(distance))
