import hashlib
import json
import shutil

import numpy as np
import pytest
import torch

from ltm.data import cache as cache_module
from ltm.data.cache import build_cache, DataConfig, RawTextSampler, TokenCache
from ltm.data.corpus import DataError


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng()
    words = ["king", "queen", "crown", "sword", "night", "love", "death", "the", "of", "and"]
    for i in range(12):
        text = " ".join(rng.choice(words, size=400 + 37 * i))
        (root / f"doc{i:02d}.txt").write_text(f"Document {i}.\n{text}\n")
    return root


@pytest.fixture(scope="module")
def cache(corpus_dir, tmp_path_factory):
    cache_dir = tmp_path_factory.mktemp("cache")
    cfg = DataConfig(source=str(corpus_dir), vocab_size=300, val_fraction=0.25,
                     shard_tokens=1024, cache_dir=str(cache_dir))
    return cache_dir, build_cache(cfg, progress=False)


def test_metrics_and_meta_agree(cache):
    cache_dir, metrics = cache
    meta = json.loads((cache_dir / "meta.json").read_text())
    assert metrics["documents"] == 12
    assert meta["splits"]["val"]["documents"] == 3
    assert metrics["tokens"] == metrics["train_tokens"] + metrics["val_tokens"]
    # vocab 300 fits uint16, not uint8
    assert meta["dtype"] == "uint16"
    train_shards = meta["splits"]["train"]["shards"]
    assert len(train_shards) > 1 and all(s["tokens"] <= 1024 for s in train_shards)
    assert sum(s["tokens"] for s in train_shards) == metrics["train_tokens"]
    assert metrics["bytes_per_token"] == pytest.approx(metrics["bytes"] / metrics["tokens"], rel=1e-3)


def test_shards_decode_back_to_the_documents(cache):
    from ltm.data.tokenizer import load_tokenizer
    cache_dir, _ = cache
    tokenizer = load_tokenizer(cache_dir / "tokenizer.json")
    split = TokenCache(cache_dir, "val")
    ids = np.concatenate([np.asarray(s) for s in split.shards]).tolist()
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert text.count("<|endoftext|>") == 3 and "Document" in text


def test_random_windows_are_shifted_pairs_and_follow_the_generator(cache):
    cache_dir, _ = cache
    train = TokenCache(cache_dir, "train")
    seed = int(torch.randint(0, 2**31, (1,)))
    x, y = train.sample_batch(5, 33, torch.Generator().manual_seed(seed))
    assert x.shape == y.shape == (5, 33) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert int(x.max()) < train.vocab_size
    x2, _ = train.sample_batch(5, 33, torch.Generator().manual_seed(seed))
    assert torch.equal(x, x2), f"seed {seed}"


def test_eval_windows_tile_each_shard_in_order(cache):
    cache_dir, _ = cache
    val = TokenCache(cache_dir, "val")
    batches = list(val.eval_batches(batch_size=4, seq_len=50))
    first = np.asarray(val.shards[0][:51], dtype=np.int64)
    assert torch.equal(batches[0][0][0], torch.from_numpy(first[:50]))
    assert torch.equal(batches[0][1][0], torch.from_numpy(first[1:]))
    windows = sum(len(x) for x, _ in batches)
    assert windows == sum((len(s) - 1) // 50 for s in val.shards)
    assert len(list(val.eval_batches(4, 50, max_batches=1))) == 1


def test_raw_text_sampler_tokenises_on_the_fly(cache):
    cache_dir, _ = cache
    x, y = RawTextSampler(cache_dir, "train").sample_batch(3, 40, torch.Generator().manual_seed(1))
    assert x.shape == (3, 40) and torch.equal(x[:, 1:], y[:, :-1])


def test_corrupt_or_missing_cache_is_a_clear_error(cache, tmp_path):
    cache_dir, _ = cache
    with pytest.raises(DataError, match="no token cache here"):
        TokenCache(tmp_path, "train")
    with pytest.raises(DataError, match="split must be one of"):
        TokenCache(cache_dir, "test")
    with pytest.raises(DataError, match="seq_len=100000"):
        TokenCache(cache_dir, "val").sample_batch(1, 100000)
    shard = cache_dir / "val_000.bin"
    original = shard.read_bytes()
    try:
        shard.write_bytes(bytes([original[0] ^ 1]) + original[1:])
        with pytest.raises(DataError, match="checksum does not match"):
            TokenCache(cache_dir, "val")
    finally:
        shard.write_bytes(original)


def copy_of(cache_dir, dest):
    shutil.copytree(cache_dir, dest)
    return dest


def test_the_training_path_hashes_each_shard_once_then_checks_size_and_mtime(cache, tmp_path,
                                                                             monkeypatch):
    cache_dir = copy_of(cache[0], tmp_path / "cache")
    stamp = tmp_path / "ckpt" / "stamp.json"
    hashed = []
    sha256 = cache_module._sha256
    monkeypatch.setattr(cache_module, "_sha256", lambda path: hashed.append(path.name) or sha256(path))
    cache_module.verify_cache(cache_dir, stamp)
    meta = json.loads((cache_dir / "meta.json").read_text())
    shards = [s["file"] for split in meta["splits"].values() for s in split["shards"]]
    assert sorted(hashed) == sorted(shards)
    hashed.clear()
    cache_module.verify_cache(cache_dir, stamp)
    assert hashed == []
    # a flipped low byte: same size, another mtime, so hashed again, and caught
    shard = cache_dir / "train_000.bin"
    original = shard.read_bytes()
    shard.write_bytes(bytes([original[0] ^ 1]) + original[1:])
    with pytest.raises(DataError) as err:
        cache_module.verify_cache(cache_dir, stamp)
    assert str(err.value) == (f"{shard}: checksum does not match meta.json; the cache is corrupt "
                              "or was changed by hand, rebuild it (dvc repro tokenize)")
    assert hashed == ["train_000.bin"]


def test_token_ids_outside_the_vocabulary_name_the_shard(cache, tmp_path):
    cache_dir = copy_of(cache[0], tmp_path / "cache")
    shard = cache_dir / "train_000.bin"
    tokens = np.fromfile(shard, dtype=np.uint16)
    tokens[5] = 65000
    tokens.tofile(shard)
    # the checksum in meta.json follows, so only the ids can tell
    meta = json.loads((cache_dir / "meta.json").read_text())
    meta["splits"]["train"]["shards"][0]["sha256"] = hashlib.sha256(shard.read_bytes()).hexdigest()
    (cache_dir / "meta.json").write_text(json.dumps(meta))
    message = (f"{shard}: token id 65000 at position 5 is outside the vocabulary of "
               f"{meta['vocab_size']}; the cache is corrupt, rebuild it (dvc repro tokenize)")
    with pytest.raises(DataError) as err:
        cache_module.verify_cache(cache_dir, tmp_path / "stamp.json")
    assert str(err.value) == message
    # a cache opened without verification stops at the first window that holds the id
    train = TokenCache(cache_dir, "train", verify=False)
    with pytest.raises(DataError) as err:
        next(train.eval_batches(2, 16))
    assert str(err.value) == message
