import numpy as np
import pytest
import torch

from ltm.data.batches import MicroBatches, SyntheticTokens, check_data, open_source, with_vocab
from ltm.data.cache import DataConfig, build_cache
from ltm.data.synthetic import SyntheticConfig
from ltm.model.lm import ModelConfig
from ltm.params import ParamsError


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("batches_corpus")
    rng = np.random.default_rng()
    for i in range(6):
        (root / f"d{i}.txt").write_text(" ".join(rng.choice(["a", "bb", "ccc", "dd e"], 500)))
    cache = tmp_path_factory.mktemp("batches_cache")
    build_cache(DataConfig(source=str(root), vocab_size=280, val_fraction=0.3, shard_tokens=2048,
                           cache_dir=str(cache)), progress=False)
    return str(cache)


def step_rows(source: str, cache_dir: str, seed: int, batch: int, accum: int, world: int, step: int):
    """All rows of one optimiser step, gathered over micro-steps and processes in order."""
    xs, ys = [], []
    for micro in range(accum):
        for rank in range(world):
            data = MicroBatches(source, cache_dir, 280, seed, 12, batch, accum, rank, world)
            x, y = data[step * accum + micro]
            assert x.shape == y.shape == (batch, 12) and x.dtype == torch.int64
            xs.append(x)
            ys.append(y)
    return torch.cat(xs), torch.cat(ys)


@pytest.mark.parametrize("source", ["cache", "raw", "synthetic"])
def test_a_step_sees_the_same_rows_however_it_is_split(cache_dir, source):
    seed = int(torch.randint(0, 2**31, (1,)))
    whole = step_rows(source, cache_dir, seed, batch=8, accum=1, world=1, step=5)
    for batch, accum, world in ((2, 4, 1), (4, 1, 2), (1, 2, 4)):
        split = step_rows(source, cache_dir, seed, batch, accum, world, step=5)
        assert torch.equal(split[0], whole[0]), f"B{batch}-A{accum}-W{world} (seed {seed})"
    x, y = whole
    assert torch.equal(x[:, 1:], y[:, :-1])
    other_step = step_rows(source, cache_dir, seed, batch=8, accum=1, world=1, step=6)
    assert not torch.equal(other_step[0], x)
    assert len({tuple(row) for row in x.tolist()}) > 1


def test_synthetic_tokens_stay_in_the_vocabulary_and_validation_is_fixed():
    data = SyntheticTokens(vocab_size=17, seed=3)
    x, y = data.sample_batch(4, 9, torch.Generator().manual_seed(0))
    assert x.shape == (4, 9) and 0 <= int(x.min()) and int(x.max()) < 17
    first, second = list(data.eval_batches(2, 5, 3)), list(data.eval_batches(2, 5, 3))
    assert len(first) == 3 and all(torch.equal(a[0], b[0]) for a, b in zip(first, second))


def test_vocab_size_comes_from_the_cache(cache_dir):
    cache_vocab = open_source("cache", cache_dir, "val", 0, 0).vocab_size
    assert with_vocab(ModelConfig(), cache_dir, "cache").vocab_size == cache_vocab
    assert with_vocab(ModelConfig(vocab_size=512), cache_dir, "cache").vocab_size == 512
    with pytest.raises(ParamsError, match="model.vocab_size: 100 is smaller than the tokenizer's"):
        with_vocab(ModelConfig(vocab_size=100), cache_dir, "cache")
    with pytest.raises(ParamsError, match="must be set"):
        with_vocab(ModelConfig(), cache_dir, "synthetic")


@pytest.fixture(scope="module")
def synthetic_cache(tmp_path_factory) -> str:
    cache = tmp_path_factory.mktemp("batches_synthetic")
    syn = SyntheticConfig(topics=2, symbols=5, length=12, train_sequences=40, val_sequences=10)
    build_cache(DataConfig(source="synthetic", synthetic=syn, cache_dir=str(cache)), progress=False)
    return str(cache)


def test_synthetic_micro_batches_are_whole_sequences(synthetic_cache):
    x, y = step_rows("cache", synthetic_cache, seed=1, batch=4, accum=2, world=1, step=0)
    assert (x[:, 0] == 0).all() and (y > 0).all()  # end-of-text, then 12 symbols


def test_train_seq_len_must_be_the_synthetic_sequence_length(synthetic_cache, tmp_path):
    stamp = tmp_path / "stamp.json"
    assert len(check_data("cache", synthetic_cache, 12, stamp)) == 64
    with pytest.raises(ParamsError, match=r"^train.seq_len: 128 differs from the sequence length 12 of "
                                          r"the sequence-aligned token cache in .*\(data.synthetic.length\)"):
        check_data("cache", synthetic_cache, 128, stamp)
    with pytest.raises(ParamsError, match=r"^train.opt.pretokenized: false cuts random spans"):
        check_data("raw", synthetic_cache, 12, stamp)
