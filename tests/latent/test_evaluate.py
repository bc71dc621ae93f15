"""ltm.latent.evaluate: the bound is NLL + KL per token, no metric named like a likelihood leaves out
the KL, the prefix metric is the suffix's NLL given the prefix, the curves by inference steps, the
importance-weighted bound against a likelihood known in closed form."""
import math

import pytest
import torch
import torch.nn.functional as F

from ltm.latent.posterior import (LatentConfig, PosteriorFitter, decoder_fitter, gaussian_kl,
                                  latent_shape)
from ltm.latent.evaluate import iwae_bounds, nelbo_per_token, validation_metrics
from ltm.model.cross_entropy import IGNORE_INDEX
from test_posterior import tiny_model, topic_batch

# one intra-op thread (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_bound_is_nll_plus_kl_per_token_for_a_fixed_posterior():
    model = tiny_model(vocab=23)
    x, y = torch.randint(23, (3, 10)), torch.randint(23, (3, 10))
    y[0, :4] = IGNORE_INDEX  # left out of the NLL and of the token count
    shape = latent_shape(model.cfg, 3)
    mu, log_var = torch.randn(shape), torch.randn(shape) - 1
    bound = nelbo_per_token(model, x, y, mu, log_var, generator=torch.Generator().manual_seed(5))
    # by hand: the same single draw of eps, the model's own mean loss, the closed-form KL
    eps = torch.randn(shape, generator=torch.Generator().manual_seed(5))
    tokens = int((y != IGNORE_INDEX).sum())
    with torch.no_grad():
        nll = model(x, y, z=mu + torch.exp(0.5 * log_var) * eps)[1] * tokens
    kl = 0.5 * (mu ** 2 + log_var.exp() - 1 - log_var).sum()
    assert tokens == 26
    assert math.isclose(float(bound), float((nll + kl) / tokens), rel_tol=1e-5)


def latent_and_plain_batches(vocab: int = 16) -> list:
    generator = torch.Generator().manual_seed(11)
    return [topic_batch(4, 12, generator) for _ in range(2)]


def test_no_latent_metric_named_loss_or_perplexity_leaves_out_the_kl():
    model = tiny_model()
    fitter = decoder_fitter(model, LatentConfig(steps=2))
    metrics = validation_metrics(model, fitter, latent_and_plain_batches(), eval_steps=[0, 2])
    nelbo = metrics["val_nll_given_fitted_z"] + metrics["val_kl_per_token"]
    assert metrics["val_kl_per_token"] > 0 and "val_nll" not in metrics
    assert math.isclose(metrics["val_nelbo"], nelbo, rel_tol=1e-9)
    assert math.isclose(metrics["val_nelbo_by_steps"][2], nelbo, rel_tol=1e-9)  # same seeds
    named = {k for k in metrics if any(w in k for w in ("loss", "ppl", "perplexity"))}
    # the prefix metrics are the suffix's NLL given a z fitted to the prefix alone: a conditional
    # likelihood that no KL belongs to (see ltm.latent.evaluate.prefix_sums)
    assert named == {"val_loss", "val_ppl_bound", "val_prefix_ppl", "val_loss_noise"}
    assert metrics["val_loss"] == metrics["val_nelbo"]
    assert math.isclose(metrics["val_ppl_bound"], math.exp(nelbo), rel_tol=1e-9)
    assert math.isclose(metrics["val_prefix_ppl"], math.exp(metrics["val_prefix_nll"]))
    # the noise is that of the bound: the two batches' (nll + kl) / tokens
    each = [validation_metrics(model, fitter, [b], seed=i)["val_nelbo"]
            for i, b in enumerate(latent_and_plain_batches())]
    assert math.isclose(metrics["val_loss_noise"], abs(each[0] - each[1]) / 2, rel_tol=1e-6)


def test_prefix_metric_of_a_plain_model_is_the_suffix_nll_given_the_prefix():
    model = tiny_model(n_latent=0)
    batches = latent_and_plain_batches()
    metrics = validation_metrics(model, None, batches)
    with torch.no_grad():
        nll = [F.cross_entropy(model(x)[0][:, 6:].flatten(0, 1), y[:, 6:].flatten(),
                               reduction="sum") for x, y in batches]
    assert math.isclose(metrics["val_prefix_nll"], float(sum(nll)) / (2 * 4 * 6), rel_tol=1e-5)
    with torch.no_grad():
        whole = sum(float(model(x, y)[1]) for x, y in batches) / 2
    assert math.isclose(metrics["val_nll"], whole, rel_tol=1e-5)
    assert metrics["val_loss"] == metrics["val_nelbo"] == metrics["val_nll"]
    assert "val_nelbo_by_steps" not in metrics


def test_curves_by_inference_steps_cover_eval_batches_and_the_prefix():
    model = tiny_model()
    fitter = decoder_fitter(model, LatentConfig(steps=2))
    batches = latent_and_plain_batches()
    both = validation_metrics(model, fitter, batches, eval_steps=[0, 3], eval_batches=1)
    first = validation_metrics(model, fitter, batches[:1], eval_steps=[0, 3])
    second = validation_metrics(model, fitter, batches[1:], eval_steps=[0, 3], seed=1)
    # the curves come from the first batch alone, the rest from both
    for key in ("val_nelbo_by_steps", "val_prefix_nll_by_steps"):
        assert set(both[key]) == {0, 3}
        for n in (0, 3):
            assert math.isclose(both[key][n], first[key][n], rel_tol=1e-9), key
    assert not math.isclose(both["val_nelbo"], first["val_nelbo"], rel_tol=1e-6)
    assert math.isclose(both["val_nelbo"], (first["val_nelbo"] + second["val_nelbo"]) / 2,
                        rel_tol=1e-6)  # equal token counts
    # 0 inner steps: the suffix given a z of q's initial state, not the fitted one
    assert first["val_prefix_nll_by_steps"][0] != first["val_prefix_nll_by_steps"][3]


def test_split_bounds_sum_to_the_total_and_the_iwae_leaves_the_other_metrics_alone():
    model = tiny_model()
    fitter = decoder_fitter(model, LatentConfig(steps=2))
    batches = latent_and_plain_batches()
    plain = validation_metrics(model, fitter, batches, eval_steps=[0, 3])
    metrics = validation_metrics(model, fitter, batches, eval_steps=[0, 3], iwae_samples=[1, 4])
    for n in (0, 3):
        split = metrics["val_nll_by_steps"][n] + metrics["val_kl_by_steps"][n]
        assert math.isclose(split, metrics["val_nelbo_by_steps"][n], rel_tol=1e-12)
        assert metrics["val_kl_by_steps"][n] > 0
    # the importance-weighted bound draws after everything else: no other metric moves
    assert {k: v for k, v in metrics.items() if "iwae" not in k} == plain
    assert metrics["val_iwae_steps"] == 3 and set(metrics["val_iwae_by_samples"]) == {1, 4}
    assert all(math.isfinite(v) for v in metrics["val_iwae_by_samples"].values())


def gaussian_case(n: int = 6, shape: tuple = (5, 2, 3), seed: int = 0):
    """A decoder whose -log p(x) is known: n observations x_i ~ N(z, 1) of each coordinate of z
    ~ N(0, I). Returns (nll(z, data) -> (B,), data (n, B, L, D), exact -log p(x) (B,), the exact
    posterior's mu and log_var); float64 throughout."""
    generator = torch.Generator().manual_seed(seed)
    data = torch.randn(n, *shape, generator=generator, dtype=torch.float64) + 1.5

    def nll(z, data):
        return (0.5 * (data - z).square() + 0.5 * math.log(2 * math.pi)).sum(0).flatten(1).sum(1)

    # x of one coordinate ~ N(0, I + 1 1^T): its inverse is I - 1 1^T / (n + 1), its
    # determinant n + 1
    total = data.sum(0)
    quadratic = data.square().sum(0) - total.square() / (n + 1)
    exact = (0.5 * quadratic + 0.5 * math.log(n + 1)
             + 0.5 * n * math.log(2 * math.pi)).flatten(1).sum(1)
    mu, log_var = total / (n + 1), torch.full(shape, -math.log(n + 1), dtype=torch.float64)
    return nll, data, exact, mu, log_var


def test_the_iwae_of_the_exact_posterior_is_the_exact_likelihood():
    # w = p(x, z) / p(z | x) = p(x) for every z: each bound is -log p(x), whatever the draws
    nll, data, exact, mu, log_var = gaussian_case()
    bounds = iwae_bounds(nll, (data,), mu, log_var, [1, 3, 16],
                         torch.Generator().manual_seed(1))
    assert bounds.shape == (3, 5)
    assert torch.allclose(bounds, exact.expand(3, -1), rtol=1e-10, atol=1e-9)


def test_the_iwae_bounds_the_likelihood_and_tightens_with_samples():
    # q from 3 inner steps from the prior: far from the posterior, so the samples matter. The
    # bound is an upper bound in expectation: averaged over 200 draw sets (fixed seeds), each K's
    # mean sits above -log p(x), falls with K, and K = 1's is the NELBO (the same fitter's q)
    nll, data, exact, _, _ = gaussian_case()
    fitter = PosteriorFitter(nll, LatentConfig(steps=3, init="prior"))
    post = fitter.fit((data,), (5, 2, 3), generator=torch.Generator().manual_seed(0))
    mu, log_var = post.mu.double(), post.log_var.double()
    ks = [1, 4, 16, 64]
    runs = torch.stack([iwae_bounds(fitter.nll, (data,), mu, log_var, ks,
                                    torch.Generator().manual_seed(seed)) for seed in range(200)])
    mean = runs.mean(0)  # (len(ks), B)
    stderr = runs.std(0) / math.sqrt(len(runs))
    gap = mean - exact  # (len(ks), B)
    assert (gap > -3 * stderr).all(), gap
    assert (gap[1:] < gap[:-1]).all(), gap
    assert (gap[-1] < 0.5 * gap[0]).all(), gap
    # K = 1 is an unbiased estimate of the NELBO: E_q[nll] in closed form, plus the KL
    var = log_var.exp()
    nelbo = ((0.5 * ((data - mu).square() + var) + 0.5 * math.log(2 * math.pi)).sum(0).flatten(1)
             .sum(1) + gaussian_kl(mu, log_var))
    assert ((mean[0] - nelbo).abs() < 4 * stderr[0]).all(), (mean[0], nelbo)

