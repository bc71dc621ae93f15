"""ltm.study.scores: each score is what it says: a suffix NLL given only the prefix, another
sequence's z, dynamic evaluation that adapts a copy, the bound split into NLL + KL."""
import math

import torch
import torch.nn.functional as F

from ltm.latent.encoder import attach_encoder
from ltm.model.lm import LTM
from ltm.study.contenders import decoder_config, latent_config
from ltm.latent.posterior import decoder_fitter, gaussian_kl, latent_shape, sequence_nll
from ltm.study.scores import (bound_curve, dynamic_suffix_nll, own_and_shuffled_suffix_nll,
                              prefix_posterior_sample, published_and_honest_bounds, suffix_nll,
                              with_init)
from ltm.study.settings import StudyConfig

CFG = StudyConfig(d_model=16, n_heads=2, n_latent=2, inner_steps=2)
V, T = 9, 12


def batch(n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(V, (n, T + 1), generator=g)
    return x[:, :-1], x[:, 1:]


def latent_model():
    torch.manual_seed(0)
    return attach_encoder(LTM(decoder_config(CFG, V, T, CFG.n_latent)), latent_config(CFG)).eval()


def test_a_plain_suffix_nll_is_the_cross_entropy_of_the_second_half():
    torch.manual_seed(1)
    model = LTM(decoder_config(CFG, V, T, 0)).eval()
    x, y = batch()
    got = suffix_nll(model, x, y, T // 2)
    logits = model(x)[0]
    expected = F.cross_entropy(logits[:, T // 2:].flatten(0, 1).double(), y[:, T // 2:].flatten(),
                               reduction="none").view(len(x), -1).mean(1)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_z_is_fitted_to_the_prefix_alone_and_shuffling_hands_each_sequence_the_next_ones():
    model, (x, y) = latent_model(), batch()
    own = prefix_posterior_sample(model, latent_config(CFG), T // 2, 2, seed=0)
    z = own(x, y)
    x2, y2 = x.clone(), y.clone()
    x2[:, T // 2 + 1:], y2[:, T // 2:] = 0, 0  # another suffix: the same z
    torch.testing.assert_close(own(x2, y2), z)
    assert not torch.equal(z[0], z[1])
    mine, others = own_and_shuffled_suffix_nll(model, x, y, T // 2, own)
    torch.testing.assert_close(mine, suffix_nll(model, x, y, T // 2, own))
    torch.testing.assert_close(others, suffix_nll(model, x, y, T // 2,
                                                  lambda xb, yb: own(xb, yb).roll(1, dims=0)))
    assert not torch.allclose(mine, others)


def test_dynamic_evaluation_adapts_a_copy_and_is_plain_at_step_size_zero():
    torch.manual_seed(2)
    model = LTM(decoder_config(CFG, V, T, 0)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = batch()
    plain = suffix_nll(model, x, y, T // 2)
    torch.testing.assert_close(dynamic_suffix_nll(model, x, y, T // 2, 3, 0.0), plain,
                               rtol=1e-5, atol=1e-6)
    adapted = dynamic_suffix_nll(model, x, y, T // 2, 3, 0.5)
    assert not torch.allclose(adapted, plain)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_the_bound_is_nll_plus_kl_and_the_cold_start_at_the_prior_pays_no_kl():
    model, (x, y) = latent_model(), batch(4)
    rows = bound_curve(model, with_init(latent_config(CFG), "prior"), x, y, [0, 2], seed=0)
    assert [r["steps"] for r in rows] == [0, 2] and rows[0]["kl"] == 0.0
    for r in rows:
        assert math.isclose(r["bound"], r["nll"] + r["kl"]) and r["ms_per_sequence"] >= 0
    enc = bound_curve(model, latent_config(CFG), x, y, [0, 2], seed=0)
    assert [r["init"] for r in enc] == ["encoder"] * 2 and enc[1]["kl"] > 0


def test_the_published_bound_reuses_the_fitting_noise_and_is_below_the_honest_one():
    model, (x, y) = latent_model(), batch(16)
    cold = with_init(latent_config(CFG), "authors")
    got = published_and_honest_bounds(model, cold, x, y, steps=16, seed=3, iwae_samples=8)
    # the published bound: the one draw of eps the inner loop fitted q with
    generator = torch.Generator().manual_seed(3)
    post = decoder_fitter(model, cold).fit((x, y), latent_shape(model.cfg, len(x)), 16, generator)
    with torch.no_grad():
        expected = (sequence_nll(model, post.sample(), x, y).double()
                    + gaussian_kl(post.mu, post.log_var).double()) / T
    torch.testing.assert_close(got["reused_noise"], expected)
    assert not torch.allclose(got["reused_noise"], got["fresh_noise"])
    # q was fitted to that noise: on the scored text the reused draw looks better than a fresh one
    assert got["reused_noise"].mean() < got["fresh_noise"].mean()
    assert all(v.shape == (16,) and torch.isfinite(v).all() for v in got.values())
