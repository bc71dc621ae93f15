"""A testbed whose answer is known (`data.source: synthetic`): sequences from K Markov chains.

Each sequence draws its topic k uniformly from K and emits its L symbols from chain k: the first
from the initial distribution pi_k, each next one from row x_{t-1} of the transition matrix P_k.
pi_k and every row of P_k are drawn from a symmetric Dirichlet, so the concentration sets how far
apart the topics are. The likelihood of a sequence, summed over the topics, is exact:

    log p(x) = logsumexp_k [log(1/K) + log pi_k(x_1) + sum_t log P_k(x_{t-1}, x_t)]

so a model's NLL can be set against the floor no model can beat, and the topic is a latent that
a latent-thought model should recover. Everything follows from data.seed.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ltm.data.corpus import DataError
from ltm.params import check

# the cache's file of exact per-sequence values of the validation split (and the chains)
EXACT_FILE = "synthetic.npz"
# independent random streams under one data.seed: the chains, then each split's sequences
_STREAMS = {"chains": 0, "train": 1, "val": 2}


@dataclass
class SyntheticConfig:
    """`data.synthetic`: the Markov-chain testbed. Defaults: built in a second on a laptop CPU;
    exact entropy 2.78 nats per token (2.76 for the second half given the first) against 3.34
    for a topic-blind bigram, and 3.10 for the best predictor that sees only the 3 symbols
    before each (the latent study's decoders, ltm.study): the topic is worth about 0.3 nats per
    token beyond such a window. At concentration 0.1, 4 symbols nearly identify the topic (1.68
    nats against an exact 1.66), which leaves a latent nothing to carry."""

    topics: int = 8  # K chains, drawn uniformly per sequence
    symbols: int = 32  # V symbols, tokens "s0" .. "s{V-1}" (plus end-of-text)
    length: int = 128  # L symbols per sequence; train.seq_len must equal it
    train_sequences: int = 4000
    val_sequences: int = 400
    # Dirichlet concentration of pi_k and of every row of P_k: smaller = sparser rows, topics
    # further apart; large = every chain near uniform and the topic nearly worthless
    concentration: float = 0.5

    def __post_init__(self) -> None:
        check(self.topics >= 1, "topics", f"must be >= 1, got {self.topics}")
        check(self.symbols >= 2, "symbols", f"must be >= 2, got {self.symbols}")
        check(self.length >= 2, "length", f"must be >= 2 (a prefix and a suffix), got {self.length}")
        check(self.train_sequences >= 1, "train_sequences", f"must be >= 1, got {self.train_sequences}")
        check(self.val_sequences >= 1, "val_sequences", f"must be >= 1, got {self.val_sequences}")
        check(self.concentration > 0, "concentration", f"must be > 0, got {self.concentration}")


@dataclass(frozen=True)
class Chains:
    """The K Markov chains: pi (K, V) initial distributions, P (K, V, V) transition matrices
    (row a of P[k] is the distribution of the symbol after a), float64."""

    pi: np.ndarray
    P: np.ndarray


def _rng(seed: int, stream: str) -> np.random.Generator:
    return np.random.default_rng([seed, _STREAMS[stream]])


def make_chains(cfg: SyntheticConfig, seed: int) -> Chains:
    """The chains of data.seed `seed` (>= 0)."""
    rng = _rng(seed, "chains")
    alpha = np.full(cfg.symbols, cfg.concentration)
    pi = rng.dirichlet(alpha, size=cfg.topics)
    P = rng.dirichlet(alpha, size=(cfg.topics, cfg.symbols))
    return Chains(pi, P)


def _draw(cdf: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One symbol per row of the cumulative distributions `cdf` (N, V): inverse-CDF sampling."""
    u = rng.random(len(cdf))
    # rounding can leave the last cumulative value a hair under 1: clip to the last symbol
    return np.minimum((cdf < u[:, None]).sum(1), cdf.shape[1] - 1)


def sample_sequences(chains: Chains, n: int, length: int, rng: np.random.Generator
                     ) -> tuple[np.ndarray, np.ndarray]:
    """n sequences of `length` symbols: tokens (n, length) int64 in [0, V), topics (n,) int64."""
    topics = rng.integers(len(chains.pi), size=n)
    cum_pi, cum_P = np.cumsum(chains.pi, -1), np.cumsum(chains.P, -1)
    tokens = np.empty((n, length), dtype=np.int64)
    tokens[:, 0] = _draw(cum_pi[topics], rng)
    for t in range(1, length):
        tokens[:, t] = _draw(cum_P[topics, tokens[:, t - 1]], rng)
    return tokens, topics


def generate_split(cfg: SyntheticConfig, seed: int, split: str) -> tuple[np.ndarray, np.ndarray]:
    """The sequences (N, L) and topics (N,) of split 'train' or 'val' under data.seed `seed`."""
    n = cfg.train_sequences if split == "train" else cfg.val_sequences
    return sample_sequences(make_chains(cfg, seed), n, cfg.length, _rng(seed, split))


def _log(p: np.ndarray) -> np.ndarray:
    # a Dirichlet draw of small concentration may hold exact zeros: log 0 = -inf is the truth
    with np.errstate(divide="ignore"):
        return np.log(p)


def topic_log_likelihoods(chains: Chains, tokens: np.ndarray) -> np.ndarray:
    """log p(x | topic k) of sequences `tokens` (N, T): (K, N) float64."""
    log_pi, log_P = _log(chains.pi), _log(chains.P)
    tokens = np.asarray(tokens, dtype=np.int64)
    prev, nxt = tokens[:, :-1], tokens[:, 1:]
    # one topic at a time keeps the temporary at (N, T) whatever K is
    return np.stack([log_pi[k, tokens[:, 0]] + log_P[k][prev, nxt].sum(1)
                     for k in range(len(chains.pi))])


def log_likelihood(chains: Chains, tokens: np.ndarray) -> np.ndarray:
    """Exact log p(x) of sequences `tokens` (N, T), summed over the uniform topics: (N,) float64
    (-inf for a sequence no chain can emit)."""
    per_topic = topic_log_likelihoods(chains, tokens) - np.log(len(chains.pi))
    top = per_topic.max(0)
    finite = np.isfinite(top)
    safe = np.where(finite, top, 0.0)
    with np.errstate(divide="ignore"):  # the sum is 0 where no topic can emit the sequence
        return np.where(finite, safe + np.log(np.exp(per_topic - safe).sum(0)), -np.inf)


def suffix_log_likelihood(chains: Chains, tokens: np.ndarray, prefix_len: int) -> np.ndarray:
    """Exact log p(x[prefix_len:] | x[:prefix_len]) = log p(x) - log p(prefix): (N,) float64."""
    tokens = np.asarray(tokens)
    return log_likelihood(chains, tokens) - log_likelihood(chains, tokens[:, :prefix_len])


def _logsumexp(a: np.ndarray) -> np.ndarray:
    """log sum exp over axis 0, -inf where every term is -inf."""
    top = a.max(0)
    safe = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return safe + np.log(np.exp(a - safe).sum(0))


def windowed_suffix_log_likelihood(chains: Chains, tokens: np.ndarray, prefix_len: int,
                                   context: int) -> np.ndarray:
    """Sum over t >= prefix_len of log p(x_t | the `context` symbols before it, t): (N,) float64.
    The best any predictor can do that sees at most `context` symbols back (and its position) and
    nothing else: the floor of a model whose receptive field is that window. The window's first
    symbol has the marginal of its position under each chain, pi_k P_k^s."""
    tokens = np.asarray(tokens, dtype=np.int64)
    N, T = tokens.shape
    log_P = _log(chains.P)  # (K, V, V)
    marginal = [chains.pi]  # position s: (K, V)
    for _ in range(max(0, T - 1 - context)):
        marginal.append(np.einsum("kv,kvw->kw", marginal[-1], chains.P))
    total = np.zeros(N)
    k = np.arange(len(chains.pi))[:, None]
    for t in range(prefix_len, T):
        s = max(0, t - context)
        seen = _log(marginal[s][:, tokens[:, s]])  # (K, N): log p(x_s | topic)
        for u in range(s + 1, t):
            seen = seen + log_P[k, tokens[:, u - 1], tokens[:, u]]
        total += _logsumexp(seen + log_P[k, tokens[:, t - 1], tokens[:, t]]) - _logsumexp(seen)
    return total


def exact_values(chains: Chains, tokens: np.ndarray, topics: np.ndarray) -> dict[str, np.ndarray]:
    """Per sequence of `tokens` (N, L): log_p (N,), log_p_suffix (N,) of the second half
    (x[L//2:]) given the first, log_p_topic (N,) = log p(x | its true topic), and topic (N,)."""
    per_topic = topic_log_likelihoods(chains, tokens)
    return {"log_p": log_likelihood(chains, tokens),
            "log_p_suffix": suffix_log_likelihood(chains, tokens, tokens.shape[1] // 2),
            "log_p_topic": per_topic[topics, np.arange(len(topics))], "topic": topics}


def bigram_entropy(train: np.ndarray, val: np.ndarray, symbols: int) -> float:
    """Nats per symbol of `val` (N, L) under a topic-blind model fitted on `train`: the first
    symbol by its frequency, each next one by the bigram counts of `train`, add-one smoothed.
    What knowing nothing of the topic costs, next to the exact entropy."""
    first = np.bincount(train[:, 0], minlength=symbols) + 1.0
    pairs = np.bincount((train[:, :-1] * symbols + train[:, 1:]).ravel(),
                        minlength=symbols * symbols).reshape(symbols, symbols) + 1.0
    log_first = np.log(first / first.sum())
    log_pairs = np.log(pairs / pairs.sum(1, keepdims=True))
    total = log_first[val[:, 0]].sum() + log_pairs[val[:, :-1], val[:, 1:]].sum()
    return float(-total / val.size)


def entropy_metrics(values: dict[str, np.ndarray], length: int) -> dict[str, float]:
    """Nats per token of the validation split from `exact_values`: exact_val_entropy (all L
    symbols of each sequence, the tokens y a window predicts), exact_val_suffix_entropy (the
    second half given the first) and exact_val_topic_entropy (given each sequence's topic)."""
    n = len(values["log_p"])
    return {"exact_val_entropy": float(-values["log_p"].sum() / (n * length)),
            "exact_val_suffix_entropy": float(-values["log_p_suffix"].sum() / (n * (length - length // 2))),
            "exact_val_topic_entropy": float(-values["log_p_topic"].sum() / (n * length))}


def save_exact(path: str | Path, chains: Chains, values: dict[str, np.ndarray]) -> None:
    """The chains and the validation split's exact values, in sequence order, to one .npz."""
    with open(path, "wb") as f:
        np.savez(f, pi=chains.pi, P=chains.P, **values)


def exact_log_likelihoods(cache_dir: str | Path) -> dict[str, np.ndarray]:
    """The exact per-sequence values of a synthetic cache's validation split, in the order in
    which `TokenCache(cache_dir, "val").eval_batches` yields their windows (one a sequence):
    log_p (N,), log_p_suffix (N,) (second half given the first), log_p_topic (N,), topic (N,)."""
    cache_dir = Path(cache_dir)
    meta_path, path = cache_dir / "meta.json", cache_dir / EXACT_FILE
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    if meta.get("source") != "synthetic" or not path.is_file():
        raise DataError(f"{path}: no exact likelihoods here; they come with a token cache of "
                        "data.source synthetic (dvc repro tokenize)")
    # the checksum in meta.json ties the file to the shards it describes
    if hashlib.sha256(path.read_bytes()).hexdigest() != meta["exact_sha256"]:
        raise DataError(f"{path}: checksum does not match meta.json; rebuild the cache (dvc repro tokenize)")
    with np.load(path) as data:
        return {key: data[key] for key in ("log_p", "log_p_suffix", "log_p_topic", "topic")}
