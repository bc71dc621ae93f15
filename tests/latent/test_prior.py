"""The diffusion prior over latent thoughts (ltm.latent.prior): the solvers against an exact Gaussian,
the denoiser's Gaussian start, the three ways to draw z, and one-line errors."""
import dataclasses

import pytest
import torch

from ltm.model.lm import LTM, ModelConfig
from ltm.params import ParamsError, from_mapping
from ltm.latent.prior import (Denoiser, Prior, PriorConfig, gaussian_skip, latents, load_prior, whiten,
                       make_scheduler, sample_with)


# one intra-op thread (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("one_thread")


def gaussian_eps_model(cfg: PriorConfig, mean: torch.Tensor, cov: torch.Tensor):
    """The exact noise predictor E[eps | x_t] for data x_0 ~ N(mean, cov) (d,): x_t ~
    N(sqrt(a) mean, a cov + (1 - a) I), a = alpha_bar_t, and E[eps | x_t] =
    sqrt(1 - a) (a cov + (1 - a) I)^-1 (x_t - sqrt(a) mean)."""
    alphas = make_scheduler(cfg, "ddpm").alphas_cumprod.double()
    eye = torch.eye(len(mean), dtype=torch.float64)

    def eps(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        a = alphas[int(t[0])]
        precision = torch.linalg.inv(a * cov + (1 - a) * eye)
        centred = x.double() - a.sqrt() * mean
        return ((1 - a).sqrt() * centred @ precision).to(x.dtype)
    return eps


MEAN = torch.tensor([1.5, -0.5, 0.25], dtype=torch.float64)
# correlated, one direction narrow (about 0.05 std): the solver must reach a thin distribution
_L = torch.tensor([[1.0, 0.0, 0.0], [0.6, 0.4, 0.0], [0.0, 0.2, 0.05]], dtype=torch.float64)
COV = _L @ _L.T
N = 40000
# tolerances: the mean's standard error is at most sqrt(1.4 / N) = 0.006, a covariance entry's
# at most 1.4 sqrt(2 / N) = 0.01; 0.03 is 3 of them beside the solver's own error, which is about
# 0.012 at 20 evaluations and 0.007 at 50 (measured; at 10 it is 0.06-0.08 on this Gaussian,
# at 5 0.25-0.4, at 1 evaluation 1.0: fewer steps do not pass)
MEAN_TOL, COV_TOL = 0.03, 0.03


@pytest.mark.parametrize("sampler,steps", [("dpmsolver++", 20), ("dpmsolver++", 50),
                                           ("ddpm", 1000)])
@pytest.mark.parametrize("schedule", ["linear", "squaredcos_cap_v2"])
def test_samples_of_a_known_gaussian_have_its_mean_and_covariance(sampler, steps, schedule):
    cfg = PriorConfig(beta_schedule=schedule)
    eps = gaussian_eps_model(cfg, MEAN, COV)
    x = sample_with(eps, cfg, (N, 3), steps, sampler, generator=torch.Generator().manual_seed(0))
    x = x.double()
    assert (x.mean(0) - MEAN).abs().max() < MEAN_TOL
    assert (torch.cov(x.T) - COV).abs().max() < COV_TOL


def test_too_few_steps_are_visibly_wrong():
    """The tolerance above is tight enough to fail a crude sampler: 5 DPM-Solver++ steps."""
    cfg = PriorConfig()
    x = sample_with(gaussian_eps_model(cfg, MEAN, COV), cfg, (N, 3), 5, "dpmsolver++",
                    generator=torch.Generator().manual_seed(0)).double()
    assert (torch.cov(x.T) - COV).abs().max() > COV_TOL


def test_v_prediction_samples_the_gaussian_too():
    cfg = PriorConfig(prediction_type="v_prediction")
    eps = gaussian_eps_model(cfg, MEAN, COV)
    alphas = make_scheduler(cfg, "ddpm").alphas_cumprod

    def v(x, t):  # v = sqrt(a) eps - sqrt(1 - a) x_0, x_0 = (x - sqrt(1 - a) eps) / sqrt(a)
        a = alphas[int(t[0])]
        e = eps(x, t)
        return a.sqrt() * e - (1 - a).sqrt() * (x - (1 - a).sqrt() * e) / a.sqrt()

    x = sample_with(v, cfg, (N, 3), 20, "dpmsolver++",
                    generator=torch.Generator().manual_seed(1)).double()
    assert (x.mean(0) - MEAN).abs().max() < MEAN_TOL
    assert (torch.cov(x.T) - COV).abs().max() < COV_TOL


def untrained_prior(cfg: PriorConfig, slots: int = 2, dim: int = 8) -> Prior:
    torch.manual_seed(0)
    mean = torch.linspace(-1, 1, slots * dim).view(slots, dim)
    std = torch.linspace(0.2, 2, slots * dim).view(slots, dim)
    return Prior(Denoiser(slots, dim, cfg, gaussian_skip(cfg)).eval(), cfg, mean, std)


@pytest.mark.parametrize("patch", [None, 4])
def test_the_untrained_denoiser_samples_the_normalisation_gaussian(patch):
    """Its output layer starts at 0, so with the Gaussian skip it is the exact noise predictor
    of N(0, I): prior samples are N(mean, std^2) per dimension. 20 evaluations: at 10, DPM-Solver++
    (the linspace timesteps of the linear schedule) draws std 0.95 of the truth, at 5 only 0.74."""
    prior = untrained_prior(PriorConfig(patch=patch, width=16, n_heads=2))
    z = prior.sample(8000, steps=20, generator=torch.Generator().manual_seed(0))
    assert z.shape == (8000, 2, 8)
    assert (z.mean(0) - prior.mean).abs().max() < 0.1  # 4 standard errors at the widest std
    assert ((z.std(0) / prior.std) - 1).abs().max() < 0.04  # 5 standard errors of a std


def test_the_denoiser_is_shaped_like_z_and_its_patch_divides_d_model():
    cfg = PriorConfig(patch=4, width=16, n_heads=2)
    model = Denoiser(3, 8, cfg, gaussian_skip(cfg))
    assert model.tokens == 6
    assert model(torch.randn(5, 3, 8), torch.randint(1000, (5,))).shape == (5, 3, 8)
    # a d_model that prior.patch does not divide (the pipeline test's 48 against 32) takes the
    # largest patch below it that does
    odd = Denoiser(3, 48, PriorConfig(patch=32, width=16, n_heads=2))
    assert odd.patch == 16 and odd.tokens == 9
    assert odd(torch.randn(2, 3, 48), torch.randint(1000, (2,))).shape == (2, 3, 48)


@pytest.mark.parametrize("mapping,message", [
    ({"width": 0}, "prior.width: must be >= 1"),
    ({"width": 30, "n_heads": 4}, "prior.n_heads: must divide width 30"),
    ({"beta_start": 0.1, "beta_end": 0.01}, "prior.beta_end: need 0 < beta_start < beta_end"),
    ({"ema": 1.0}, "prior.ema: must be in [0, 1)"),
    ({"solver_order": 4}, "prior.solver_order: must be 1, 2 or 3"),
    ({"prediction_type": "sample"}, "prior.prediction_type: expected 'epsilon' or 'v_prediction'"),
    ({"sample_steps": 2000}, "prior.sample_steps: must be <= train_timesteps"),
    ({"patch": 0}, "prior.patch: must be >= 1"),
    ({"whiten_rank": -1}, "prior.whiten_rank: must be >= 0"),
    ({"whiten_rank": 384}, "prior.whiten_rank: must be below train_sequences 384"),
    ({"stesp": 3}, "prior.stesp: unknown parameter"),
])
def test_bad_params_are_one_line(mapping, message):
    with pytest.raises(ParamsError) as err:
        from_mapping(PriorConfig, mapping, "prior")
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_bad_sampling_requests_are_one_line(tmp_path):
    cfg = PriorConfig()
    with pytest.raises(ParamsError, match="sampler: expected one of dpmsolver"):
        make_scheduler(cfg, "ddim")
    with pytest.raises(ParamsError, match="steps: must be in 1..1000"):
        sample_with(lambda x, t: x, cfg, (2, 3), 0)
    with pytest.raises(ParamsError, match="no trained prior there"):
        load_prior(tmp_path)


def test_the_three_ways_to_draw_z():
    cfg = ModelConfig(vocab_size=64, n_layers=2, d_model=8, n_heads=2, max_seq_len=32, n_latent=2)
    torch.manual_seed(0)
    model = LTM(cfg).eval()
    prior = untrained_prior(PriorConfig(width=16, n_heads=2, patch=None), slots=4, dim=8)
    generator = torch.Generator().manual_seed(0)
    from_prior = latents(model, "prior", 3, prior=prior, steps=5, generator=generator)
    gaussian = latents(model, "gaussian", 3, scale=0.5, generator=generator)
    fitted = latents(model, "prompt", 2, prompts=[[1, 2, 3, 4], [5, 6, 7]], fit_steps=2)
    assert from_prior.shape == gaussian.shape == (3, 4, 8)
    assert fitted.shape == (2, 4, 8)
    with pytest.raises(ParamsError, match="trained for another model"):
        latents(model, "prior", 3, prior=untrained_prior(PriorConfig(width=16, n_heads=2,
                                                                     patch=None)))
    with pytest.raises(ParamsError, match="the model is plain"):
        latents(LTM(ModelConfig(vocab_size=64, n_layers=1, d_model=8, n_heads=2)), "gaussian", 1)


def test_whitening_is_undone_exactly_by_its_inverse():
    generator = torch.Generator().manual_seed(0)
    basis = torch.linalg.qr(torch.randn(24, 5, generator=generator))[0].t()  # (5, 24) orthonormal
    gain = torch.tensor([3.0, 2.0, 1.5, 0.5, 1.0])
    x = torch.randn(7, 3, 8, generator=generator)
    white = whiten(x, basis, gain)
    torch.testing.assert_close(whiten(white, basis, gain, inverse=True), x)
    # along the basis divided by gain, across it untouched
    torch.testing.assert_close(white.flatten(1) @ basis.t(), (x.flatten(1) @ basis.t()) / gain)
    across = x.flatten(1) - (x.flatten(1) @ basis.t()) @ basis
    torch.testing.assert_close(white.flatten(1) - (white.flatten(1) @ basis.t()) @ basis, across)
    assert whiten(x, None, None) is x


def test_the_untrained_whitened_prior_samples_the_low_rank_fit():
    """With a basis, the Gaussian skip samples mean + std * (N(0, I) widened by gain along the
    basis): the covariance along each basis direction is gain^2 in normalised coordinates."""
    cfg = PriorConfig(patch=4, width=16, n_heads=2)
    prior = untrained_prior(cfg)
    basis = torch.zeros(2, 16)
    basis[0, :8], basis[1, 8:] = 8 ** -0.5, 8 ** -0.5  # all of slot 0 together, all of slot 1
    prior = dataclasses.replace(prior, basis=basis, gain=torch.tensor([3.0, 0.5]))
    z = prior.sample(8000, steps=20, generator=torch.Generator().manual_seed(0))
    x = ((z - prior.mean) / prior.std).flatten(1)
    along = x @ basis.t()  # (8000, 2)
    assert abs(float(along[:, 0].std()) / 3.0 - 1) < 0.05
    assert abs(float(along[:, 1].std()) / 0.5 - 1) < 0.05
    across = x - along @ basis
    # the other 14 directions at unit variance each (standard error of this mean about 0.004)
    assert abs(float(across.square().sum(1).mean()) / 14 - 1) < 0.03
    torch.testing.assert_close(prior.encode(prior.decode(x.view(-1, 2, 8))), x.view(-1, 2, 8),
                               atol=1e-4, rtol=1e-4)
