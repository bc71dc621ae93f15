"""ltm.latent.evaluate: the bound is NLL + KL per token, no metric named like a likelihood leaves out
the KL, the prefix metric is the suffix's NLL given the prefix, the curves by inference steps."""
import math

import torch
import torch.nn.functional as F

from ltm.latent.posterior import LatentConfig, decoder_fitter, latent_shape
from ltm.latent.evaluate import nelbo_per_token, validation_metrics
from ltm.model.cross_entropy import IGNORE_INDEX
from test_posterior import tiny_model, topic_batch


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
