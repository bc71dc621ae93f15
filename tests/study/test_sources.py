"""ltm.study.sources: the testbed's windows, exact values and floor; the corpus's windows."""
import numpy as np
import pytest
import torch

from ltm.data.cache import DataConfig, TokenCache, build_cache
from ltm.data.synthetic import SyntheticConfig, generate_split
from ltm.study.settings import StudyConfig
from ltm.study.sources import corpus_source, receptive_field, synthetic_source
from tiny_corpus import write_documents

SYN = SyntheticConfig(topics=3, symbols=5, length=10, train_sequences=40, val_sequences=12)


def test_the_testbed_predicts_every_symbol_from_end_of_text_on():
    data = DataConfig(source="synthetic", synthetic=SYN, cache_dir="unused", seed=3)
    source = synthetic_source(data, StudyConfig(val_sequences=8, window=2, n_layers=2))
    val, _ = generate_split(SYN, 3, "val")
    assert source.vocab_size == 6 and source.prefix_len == 5
    assert source.val_x.shape == source.val_y.shape == (8, 10)
    assert (source.val_x[:, 0] == 5).all()  # end-of-text, then the symbols
    assert torch.equal(source.val_y, torch.from_numpy(val[:8]))
    assert torch.equal(source.val_x[:, 1:], source.val_y[:, :-1])
    x, y = source.sample(4, torch.Generator().manual_seed(0))
    assert x.shape == (4, 10) and torch.equal(x[:, 1:], y[:, :-1])
    # the floor sees less than the exact conditional, so it is at least as high on average
    assert source.exact.shape == source.floor.shape == (8,)
    assert source.floor.mean() >= source.exact.mean() - 1e-9


def test_the_same_generator_draws_the_same_batches():
    data = DataConfig(source="synthetic", synthetic=SYN, cache_dir="unused")
    source = synthetic_source(data, StudyConfig())
    a = source.sample(6, torch.Generator().manual_seed(1))
    b = source.sample(6, torch.Generator().manual_seed(1))
    assert all(torch.equal(p, q) for p, q in zip(a, b))


@pytest.mark.parametrize("layers, window, field", [(1, 1, 1), (2, 2, 3), (3, 4, 10)])
def test_the_receptive_field_grows_by_window_less_one_per_layer(layers, window, field):
    assert receptive_field(StudyConfig(n_layers=layers, window=window)) == field


def test_the_corpus_scores_the_first_validation_windows(tmp_path):
    write_documents(tmp_path)
    cfg = DataConfig(source=str(tmp_path), vocab_size=300, val_fraction=0.3,
                     cache_dir=str(tmp_path / "cache"))
    meta = build_cache(cfg, progress=False)
    source = corpus_source(cfg.cache_dir, 300, StudyConfig(seq_len=16, val_sequences=5))
    first = next(TokenCache(cfg.cache_dir, "val").eval_batches(5, 16))
    assert torch.equal(source.val_x, first[0]) and torch.equal(source.val_y, first[1])
    assert source.exact is None and source.floor is None and meta["vocab_size"] <= 300
    x, y = source.sample(3, torch.Generator().manual_seed(0))
    assert x.shape == (3, 16) and np.array_equal(x[:, 1:].numpy(), y[:, :-1].numpy())
