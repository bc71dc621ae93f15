"""Training the diffusion prior (ltm.train.prior_trainer): the loss falls on a toy distribution, a resumed
run equals an uninterrupted one, the normalisation is the posteriors' mixture's, and the train
stage's folders of the latent and plain models are found."""
import dataclasses
import math

import pytest
import torch

from ltm.train.settings import CounterpartConfig
from ltm.model.lm import ModelConfig
from ltm.latent.prior import PRIOR_FILE, PriorConfig
from ltm.params import ParamsError
from ltm.train.prior_trainer import (PriorTrainer, model_dirs, normalisation, principal_whitening,
                              train_prior)
from ltm.train.settings import TrainConfig


# one intra-op thread (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("one_thread")


def toy_posteriors(n: int = 256, slots: int = 2, dim: int = 8) -> dict:
    """Two clusters whose every coordinate shares one sign (+1 or -1, half the sequences each),
    narrow posteriors around them: far from any Gaussian, so the Gaussian start is not enough."""
    generator = torch.Generator().manual_seed(0)
    signs = torch.where(torch.rand(n, generator=generator) < 0.5, -1.0, 1.0)
    mu = signs[:, None, None] * torch.ones(n, slots, dim) + 0.05 * torch.randn(
        n, slots, dim, generator=generator)
    log_var = torch.full((n, slots, dim), -6.0)
    return {"train_mu": mu, "train_log_var": log_var, "heldout_mu": mu[:32],
            "heldout_log_var": log_var[:32]}


# per-dimension normalisation only: these tests are of the network's learning. Whitened, the
# clusters' one direction (all coordinates together) is scaled to unit variance and the start is
# no longer far from the data; 300 steps then do not learn the two modes (LOG, 2026-11-23)
TOY = PriorConfig(patch=None, width=32, n_heads=2, depth=2, steps=300, batch_size=64, lr=0.002,
                  ema=0.0, checkpoint_every=0, warmup_steps=10, whiten_rank=0)


def test_the_training_loss_falls_on_a_toy_distribution():
    _, metrics = train_prior(TOY, toy_posteriors(), None, say=lambda *a: None)
    # the Gaussian start's loss is about 0.3 here; the two clusters are learnable far below it
    assert metrics["train_loss_last"] < 0.6 * metrics["train_loss_first"]
    assert metrics["curve"][-1]["loss"] < metrics["curve"][0]["loss"]


def test_the_trained_toy_prior_samples_both_clusters():
    prior, _ = train_prior(TOY, toy_posteriors(), None, say=lambda *a: None)
    z = prior.sample(400, steps=20, generator=torch.Generator().manual_seed(0))
    means = z.flatten(1).mean(1)
    # nearly every sample sits near one of the clusters (mean of its coordinates near +-1), and
    # each cluster gets a fair share (the data's is one half each)
    assert ((means.abs() - 1).abs() < 0.3).float().mean() > 0.9
    assert 0.3 < (means > 0).float().mean() < 0.7


def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path):
    """Stopped after 20 steps (its checkpoint), resumed to 30: every weight, the averaged ones,
    the optimiser state and the losses are those of a run of 30 steps without a stop."""
    data = toy_posteriors(64)
    cfg = dataclasses.replace(TOY, steps=30, checkpoint_every=10, ema=0.9, batch_size=16)
    quiet = lambda *a: None  # noqa: E731
    train_prior(cfg, data, tmp_path / "whole", say=quiet)
    train_prior(dataclasses.replace(cfg, steps=20), data, tmp_path / "stopped", say=quiet)
    _, metrics = train_prior(cfg, data, tmp_path / "stopped", say=quiet)
    assert metrics["run"] == "resumed at step 20"
    whole = torch.load(tmp_path / "whole" / PRIOR_FILE, weights_only=False)
    resumed = torch.load(tmp_path / "stopped" / PRIOR_FILE, weights_only=False)
    assert whole["losses"] == resumed["losses"]
    for key in ("model", "ema"):
        for name, value in whole[key].items():
            assert torch.equal(value, resumed[key][name]), f"{key}.{name}"
    assert torch.equal(whole["generator"], resumed["generator"])


def test_another_config_starts_fresh(tmp_path):
    data = toy_posteriors(64)
    cfg = dataclasses.replace(TOY, steps=5, batch_size=8)
    said = []
    train_prior(cfg, data, tmp_path, say=said.append)
    _, metrics = train_prior(dataclasses.replace(cfg, lr=0.001), data, tmp_path, say=said.append)
    assert metrics["run"] == "started: the checkpoint did not match"
    assert "not resuming" in said[-1]
    # a finished run asked again: nothing to train, the same result
    _, again = train_prior(dataclasses.replace(cfg, lr=0.001), data, tmp_path, say=said.append)
    assert again["run"] == "resumed at step 5"
    assert again["train_loss_last"] == metrics["train_loss_last"]


def test_the_normalisation_is_that_of_the_posteriors_mixture():
    data = toy_posteriors(128)
    mu, log_var = data["train_mu"], data["train_log_var"] + 4  # wider: sigma matters
    mean, std = normalisation(mu, log_var, True)
    generator = torch.Generator().manual_seed(0)
    draws = mu.repeat(200, 1, 1) + torch.exp(0.5 * log_var).repeat(200, 1, 1) * torch.randn(
        200 * len(mu), *mu.shape[1:], generator=generator)
    torch.testing.assert_close(mean, draws.mean(0), atol=0.01, rtol=0)
    torch.testing.assert_close(std, draws.std(0), atol=0.01, rtol=0)
    zero, one = normalisation(mu, log_var, False)
    assert torch.equal(zero, torch.zeros(2, 8)) and torch.equal(one, torch.ones(2, 8))


def test_the_whitening_finds_a_low_rank_gaussians_directions_and_widths():
    """Posterior means of a rank-2 + unit-diagonal Gaussian (in normalised coordinates) give
    its two directions and their standard deviations, the mixture's sigma^2 included; the
    whitened batches then have unit variance along them."""
    generator = torch.Generator().manual_seed(0)
    d, n = 32, 4000
    directions = torch.linalg.qr(torch.randn(d, 2, generator=generator))[0].t()  # (2, d)
    widths = torch.tensor([4.0, 2.0])
    mu = (torch.randn(n, 2, generator=generator) * widths) @ directions + torch.randn(
        n, d, generator=generator)
    log_var = torch.full((n, d), math.log(0.5))
    mean, std = torch.zeros(d), torch.ones(d)
    basis, gain = principal_whitening(mu.view(n, 4, 8), log_var.view(n, 4, 8), mean.view(4, 8),
                                      std.view(4, 8), 2)
    assert basis.shape == (2, d) and gain.shape == (2,)
    torch.testing.assert_close(basis @ basis.t(), torch.eye(2), atol=1e-5, rtol=0)
    assert ((basis @ directions.t()).abs().max(1).values > 0.99).all()
    # var along each = width^2 + 1 (the means' diagonal) + 0.5 (sigma^2), within 5%
    torch.testing.assert_close(gain, (widths.square() + 1.5).sqrt(), rtol=0.05, atol=0)
    with pytest.raises(ParamsError, match="whiten_rank: must be below the 4000"):
        principal_whitening(mu.view(n, 4, 8), log_var.view(n, 4, 8), mean.view(4, 8),
                            std.view(4, 8), n)


def test_the_batches_are_normalised_draws_of_the_posteriors():
    data = toy_posteriors(64)
    trainer = PriorTrainer(dataclasses.replace(TOY, batch_size=4000), data["train_mu"],
                           data["train_log_var"], None, say=lambda *a: None)
    x0, noise, t = trainer.batch()
    assert x0.shape == noise.shape == (4000, 2, 8) and t.shape == (4000,)
    assert abs(float(x0.mean())) < 0.1 and abs(float(x0.std()) - 1) < 0.05


@pytest.mark.parametrize("n_latent,latent_steps,enabled,expected", [
    (0, 16, True, ("counterpart-latent", ".")),
    (4, 16, True, (".", "counterpart-plain")),
    (4, 16, False, (".", None)),
    (0, 16, False, (None, ".")),
    (4, 0, True, ("counterpart-latent", ".")),  # latents without inner steps train as plain
])
def test_the_models_of_the_train_stage_are_found(tmp_path, n_latent, latent_steps, enabled,
                                                  expected):
    model_cfg = ModelConfig(n_latent=n_latent)
    train_cfg = TrainConfig(counterpart=CounterpartConfig(enabled=enabled))
    train_cfg = dataclasses.replace(train_cfg,
                                    latent=dataclasses.replace(train_cfg.latent, steps=latent_steps))
    found = model_dirs(tmp_path, model_cfg, train_cfg)
    assert tuple(None if p is None else str(p.relative_to(tmp_path)) for p in found) == expected
