import hashlib
import json
import shutil

import numpy as np
import pytest
import torch

from ltm.data import cache as cache_module
from ltm.data.cache import build_cache, DataConfig, RawTextSampler, TokenCache
from ltm.data.corpus import DataError
from ltm.data.synthetic import (SyntheticConfig, exact_log_likelihoods, generate_split,
                                log_likelihood, make_chains)
from ltm.data.tokenizer import end_of_text_id, load_tokenizer
from ltm.params import ParamsError
from tiny_corpus import write_documents


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return write_documents(tmp_path_factory.mktemp("corpus"))


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


def test_text_random_windows_start_anywhere_as_before(cache):
    """Text caches draw a window start uniformly over every token that has seq_len after it
    (the draws of a checkpointed generator must not move with the synthetic source)."""
    cache_dir, _ = cache
    train = TokenCache(cache_dir, "train")
    x, _ = train.sample_batch(6, 20, torch.Generator().manual_seed(3))
    windows = [len(s) - 20 for s in train.shards]
    picks = torch.randint(sum(windows), (6,), generator=torch.Generator().manual_seed(3)).tolist()
    for row, pick in zip(x, picks):
        index = 0
        while pick >= windows[index]:
            pick, index = pick - windows[index], index + 1
        assert torch.equal(row, torch.from_numpy(np.asarray(train.shards[index][pick:pick + 20], np.int64)))


SYN = SyntheticConfig(topics=3, symbols=10, length=16, train_sequences=200, val_sequences=30,
                      concentration=0.3)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    cache_dir = tmp_path_factory.mktemp("synthetic")
    # 1024 tokens a shard: 60 sequences of 16 + end-of-text, so the train split spans 4 shards
    cfg = DataConfig(source="synthetic", synthetic=SYN, seed=7, shard_tokens=1024, cache_dir=str(cache_dir))
    return cache_dir, build_cache(cfg, progress=False)


def test_synthetic_shards_hold_whole_sequences_after_an_end_of_text(synthetic):
    cache_dir, metrics = synthetic
    meta = json.loads((cache_dir / "meta.json").read_text())
    assert meta["sequence_length"] == 16 and meta["vocab_size"] == 11 and meta["dtype"] == "uint8"
    assert [s["tokens"] for s in meta["splits"]["train"]["shards"]] == [1 + 60 * 17] * 3 + [1 + 20 * 17]
    tokenizer = load_tokenizer(cache_dir / "tokenizer.json")
    eot = end_of_text_id(tokenizer)
    tokens, _ = generate_split(SYN, 7, "train")
    first = np.asarray(TokenCache(cache_dir, "train").shards[1][:35], dtype=np.int64)
    assert first[0] == first[17] == first[34] == eot
    assert tokenizer.decode(first[1:17].tolist()) == " ".join(f"s{s}" for s in tokens[60])
    assert metrics["val_tokens"] == 1 + 30 * 17 and 0 < metrics["exact_val_entropy"] < np.log(10)


def test_every_synthetic_training_window_is_one_sequence(synthetic):
    cache_dir, _ = synthetic
    eot = end_of_text_id(load_tokenizer(cache_dir / "tokenizer.json"))
    sequences = {tuple(row) for row in (generate_split(SYN, 7, "train")[0] + 1).tolist()}
    x, y = TokenCache(cache_dir, "train").sample_batch(300, 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (300, 16)
    assert (x[:, 0] == eot).all() and not (y == eot).any()
    assert all(tuple(row) in sequences for row in y.tolist())
    # the draws reach every shard, the short last one too
    assert len({tuple(row) for row in y.tolist()}) > 100


def test_synthetic_eval_windows_are_the_sequences_in_order(synthetic):
    cache_dir, _ = synthetic
    batches = list(TokenCache(cache_dir, "val").eval_batches(batch_size=8, seq_len=16))
    assert [len(x) for x, _ in batches] == [8, 8, 8, 6]
    y = torch.cat([y for _, y in batches]).numpy()
    np.testing.assert_array_equal(y, generate_split(SYN, 7, "val")[0] + 1)
    # the exact values come in the same order
    exact = exact_log_likelihoods(cache_dir)
    np.testing.assert_allclose(exact["log_p"], log_likelihood(make_chains(SYN, 7), y - 1), rtol=1e-12)
    assert exact["log_p_suffix"].shape == exact["topic"].shape == (30,)


def test_a_window_longer_or_shorter_than_a_sequence_is_a_one_line_error(synthetic):
    cache_dir, _ = synthetic
    for seq_len in (15, 17):
        with pytest.raises(ParamsError) as err:
            TokenCache(cache_dir, "train").sample_batch(2, seq_len)
        assert str(err.value) == (f"train.seq_len: {seq_len} differs from the sequence length 16 of "
                                  f"the sequence-aligned token cache in {cache_dir} "
                                  "(data.synthetic.length): each window is one sequence")


def test_exact_values_only_from_their_own_synthetic_cache(synthetic, cache, tmp_path):
    with pytest.raises(DataError, match="no exact likelihoods here"):
        exact_log_likelihoods(cache[0])
    cache_dir = copy_of(synthetic[0], tmp_path / "synthetic")
    exact = cache_dir / "synthetic.npz"
    values = dict(np.load(exact))
    values["log_p"] = values["log_p"][::-1].copy()
    np.savez(exact, **values)
    with pytest.raises(DataError, match="synthetic.npz: checksum does not match meta.json"):
        exact_log_likelihoods(cache_dir)
