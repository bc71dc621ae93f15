"""ltm.data.synthetic: the exact likelihood of the Markov-chain topics against brute force, the
seed, and the per-sequence values a cache hands back."""
import itertools

import numpy as np
import pytest

from ltm.data.cache import DataConfig
from ltm.data.corpus import DataError
from ltm.data.synthetic import (SyntheticConfig, bigram_entropy, entropy_metrics, exact_values,
                                generate_split, log_likelihood, make_chains, suffix_log_likelihood)
from ltm.params import ParamsError, from_mapping

TINY = SyntheticConfig(topics=2, symbols=3, length=4, train_sequences=50, val_sequences=20,
                       concentration=1.0)


def every_sequence(symbols: int, length: int) -> np.ndarray:
    return np.array(list(itertools.product(range(symbols), repeat=length)))


def loop_probability(chains, seq) -> float:
    """p(x) by the definition: the average over topics of pi_k(x_1) prod_t P_k(x_{t-1}, x_t)."""
    total = 0.0
    for k in range(len(chains.pi)):
        p = chains.pi[k, seq[0]]
        for a, b in zip(seq[:-1], seq[1:]):
            p *= chains.P[k, a, b]
        total += p / len(chains.pi)
    return total


def test_exact_likelihood_matches_brute_force():
    chains = make_chains(TINY, seed=5)
    seqs = every_sequence(TINY.symbols, TINY.length)
    log_p = log_likelihood(chains, seqs)
    assert log_p.dtype == np.float64 and log_p.shape == (3 ** 4,)
    assert np.exp(log_p).sum() == pytest.approx(1.0, abs=1e-12)
    expected = np.log([loop_probability(chains, s) for s in seqs])
    np.testing.assert_allclose(log_p, expected, rtol=1e-12)


def test_suffix_given_prefix_matches_brute_force():
    chains = make_chains(TINY, seed=6)
    seqs = every_sequence(TINY.symbols, TINY.length)
    joint = np.array([loop_probability(chains, s) for s in seqs])
    suffix = suffix_log_likelihood(chains, seqs, prefix_len=2)
    for seq, log_cond in zip(seqs[::7], suffix[::7]):
        # p(suffix | prefix) = p(x) / sum of p over every sequence with the same prefix
        same_prefix = joint[(seqs[:, :2] == seq[:2]).all(1)].sum()
        assert log_cond == pytest.approx(np.log(loop_probability(chains, seq) / same_prefix), rel=1e-12)
    # for each prefix, the conditionals of its suffixes sum to 1
    for prefix in every_sequence(TINY.symbols, 2):
        rows = (seqs[:, :2] == prefix).all(1)
        assert np.exp(suffix[rows]).sum() == pytest.approx(1.0, abs=1e-12)


def test_impossible_sequences_have_log_probability_minus_infinity():
    chains = make_chains(TINY, seed=0)
    P = chains.P.copy()
    P[:, 0, :] = [1.0, 0.0, 0.0]  # after symbol 0 always 0 again, in every topic
    sealed = type(chains)(chains.pi, P)
    log_p = log_likelihood(sealed, np.array([[0, 1, 2, 2], [0, 0, 0, 0]]))
    assert log_p[0] == -np.inf and np.isfinite(log_p[1])


def test_sequences_follow_the_seed_and_only_the_seed():
    tokens, topics = generate_split(TINY, 11, "val")
    again, again_topics = generate_split(TINY, 11, "val")
    assert tokens.shape == (20, 4) and tokens.dtype == np.int64 and topics.shape == (20,)
    assert np.array_equal(tokens, again) and np.array_equal(topics, again_topics)
    assert 0 <= tokens.min() and tokens.max() < TINY.symbols
    assert not np.array_equal(generate_split(TINY, 12, "val")[0], tokens)
    assert not np.array_equal(make_chains(TINY, 12).P, make_chains(TINY, 11).P)
    # the splits are different streams of the same chains
    assert not np.array_equal(generate_split(TINY, 11, "train")[0][:20], tokens)


def test_sampled_topics_and_symbols_follow_the_chains():
    cfg = SyntheticConfig(topics=2, symbols=3, length=6, val_sequences=20000, concentration=1.0)
    chains = make_chains(cfg, 3)
    tokens, topics = generate_split(cfg, 3, "val")
    assert abs(topics.mean() - 0.5) < 0.02
    first = tokens[topics == 0, 0]
    np.testing.assert_allclose(np.bincount(first, minlength=3) / len(first), chains.pi[0], atol=0.02)
    after = tokens[topics == 1, 1:][tokens[topics == 1, :-1] == 2]
    np.testing.assert_allclose(np.bincount(after, minlength=3) / len(after), chains.P[1, 2], atol=0.02)


def test_entropies_of_the_defaults_are_plausible():
    cfg = SyntheticConfig(train_sequences=500, val_sequences=100)
    chains = make_chains(cfg, 1337)
    train, val = generate_split(cfg, 1337, "train"), generate_split(cfg, 1337, "val")
    metrics = entropy_metrics(exact_values(chains, *val), cfg.length)
    assert 0 < metrics["exact_val_topic_entropy"] <= metrics["exact_val_entropy"] < np.log(cfg.symbols)
    # knowing the topic is worth at most log K over the whole sequence (p(x) >= p(x | k) / K)
    assert metrics["exact_val_entropy"] - metrics["exact_val_topic_entropy"] <= np.log(8) / cfg.length + 1e-12
    assert 0 < metrics["exact_val_suffix_entropy"] < np.log(cfg.symbols)
    # the topic matters: a bigram model that ignores it is far above the exact entropy
    assert bigram_entropy(train[0], val[0], cfg.symbols) > metrics["exact_val_entropy"] + 0.5


def test_bad_synthetic_params_are_one_line_errors():
    with pytest.raises(ParamsError, match=r"^data.synthetic.length: must be >= 2"):
        from_mapping(SyntheticConfig, {"length": 1}, "data.synthetic")
    with pytest.raises(ParamsError, match=r"^data.synthetic.topic: unknown parameter"):
        from_mapping(DataConfig, {"synthetic": {"topic": 3}, "cache_dir": "c"}, "data")
    with pytest.raises(ParamsError, match=r"^data.seed: must be >= 0 for source synthetic"):
        from_mapping(DataConfig, {"source": "synthetic", "seed": -1, "cache_dir": "c"}, "data")
    with pytest.raises(ParamsError, match=r"^data.synthetic.concentration: must be > 0"):
        from_mapping(SyntheticConfig, {"concentration": 0}, "data.synthetic")


def test_exact_values_of_a_folder_without_a_synthetic_cache_is_a_clear_error(tmp_path):
    from ltm.data.synthetic import exact_log_likelihoods
    with pytest.raises(DataError, match="no exact likelihoods here"):
        exact_log_likelihoods(tmp_path)


def test_the_window_floor_matches_brute_force_and_reaches_the_exact_value_with_full_context():
    from ltm.data.synthetic import windowed_suffix_log_likelihood
    chains = make_chains(TINY, seed=7)
    seqs = every_sequence(TINY.symbols, TINY.length)
    joint = np.array([loop_probability(chains, s) for s in seqs])
    # context 1 at positions 2, 3: p(x_t | x_{t-1}) at position t, marginalised by enumeration
    floor = windowed_suffix_log_likelihood(chains, seqs, prefix_len=2, context=1)
    for seq, got in zip(seqs[::5], floor[::5]):
        expected = 0.0
        for t in (2, 3):
            pair = joint[(seqs[:, t - 1] == seq[t - 1]) & (seqs[:, t] == seq[t])].sum()
            expected += np.log(pair / joint[seqs[:, t - 1] == seq[t - 1]].sum())
        assert got == pytest.approx(expected, rel=1e-10)
    # a context reaching the start of every sequence sees all there is: the exact conditional
    full = windowed_suffix_log_likelihood(chains, seqs, prefix_len=2, context=TINY.length)
    np.testing.assert_allclose(full, suffix_log_likelihood(chains, seqs, 2), rtol=1e-10)
    # seeing less can only cost, in expectation over the source
    assert -(joint * floor).sum() >= -(joint * suffix_log_likelihood(chains, seqs, 2)).sum()
