"""The ablate protocol's quality score for a latent model: its NLL given z drawn from the prior
with fixed seeds, not its fitted bound (ltm.ablation.runner.Runner.latent_score)."""
from __future__ import annotations

import torch

from ltm.latent.posterior import latent_shape, sequence_nll, token_counts
from ltm.model.lm import LTM


@torch.no_grad()
def prior_nll_sums(model: LTM, x: torch.Tensor, y: torch.Tensor, seed: int) -> torch.Tensor:
    """(sum of NLL, tokens) of a batch, float64 (2,), each sequence scored given one z drawn from
    the prior N(0, I) by a generator seeded `seed`: an unbiased estimate of E_prior[NLL], the
    negative ELBO of q = prior (KL 0), so an upper bound of -log p(x) as well. No inner loop: the
    same draws for every model, and a score smooth in the weights (the ablate protocol's for a
    latent model, whose fitted bound amplifies float rounding through the Adam steps)."""
    generator = torch.Generator(x.device).manual_seed(seed)
    z = torch.randn(latent_shape(model.cfg, x.shape[0]), device=x.device, generator=generator)
    nll = sequence_nll(model, z.to(model.embed.weight.dtype), x, y).double().sum()
    return torch.stack([nll, token_counts(y).sum().double()])
