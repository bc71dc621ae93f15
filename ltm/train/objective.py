"""The training objective: `LossModel`, the model with its loss as one module (so DDP and
torch.compile see the whole step). With latent thoughts, each sequence's latent vectors come from
a short optimisation of their posterior (ltm.latent.posterior, the fast loop) before the decoder's
step (the slow loop). The losses themselves live in ltm.model.cross_entropy.
"""
from __future__ import annotations

import torch
from torch import nn

from ltm.latent.encoder import amortised_nelbo
from ltm.latent.posterior import LatentConfig, decoder_fitter, encoder_start, latent_shape, token_counts
from ltm.model.cross_entropy import IGNORE_INDEX, chunked_loss, fused_linear_cross_entropy
from ltm.model.lm import LTM


class LossModel(nn.Module):
    """The model plus its loss, as one module, so DDP and torch.compile see the whole step.

    With latent thoughts (model.n_latent > 0 and latent.steps > 0) each batch first gets its
    posterior q(z) from the inner loop (ltm.latent.posterior.PosteriorFitter: latent.steps steps on the
    negative ELBO, only q's parameters updated), then the decoder's loss is the mean token
    cross-entropy given one sample of q, detached: the slow step, as in Latent Thought Models.
    With latent.init encoder (model.encoder attached, ltm.latent.encoder) q starts at the
    encoder's prediction, and the encoder's own NELBO per token joins the loss's gradient, not its
    value: the loss returned (the train curve) stays the decoder's cross-entropy.
    latent: the train.latent section (None = its defaults); compile also compiles the inner step
    when latent.compile is auto. fused_ce: Liger-Kernel's fused linear cross-entropy
    (train.opt.fused_ops cross_entropy, ltm.train.fused_ops) instead of either loss above."""

    def __init__(self, model: LTM, fused_loss: bool, compile: bool,
                 latent: LatentConfig | None = None, fused_ce: bool = False) -> None:
        super().__init__()
        self.model, self.fused_loss, self.compile = model, fused_loss, compile
        self.fused_ce = fused_ce
        self.latent = LatentConfig() if latent is None else latent
        self.uses_latents = model.cfg.n_latent > 0 and self.latent.steps > 0
        compile_inner = compile if self.latent.compile == "auto" else self.latent.compile
        # a plain attribute, not a submodule: it holds the model, which is registered above
        self.fitter = (decoder_fitter(model, self.latent, compile_inner) if self.uses_latents
                       else None)

    def loss(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        if self.fused_ce:
            return fused_linear_cross_entropy(self.model.hidden(x, z), self.model.lm_head.weight,
                                              y, IGNORE_INDEX)
        if not self.fused_loss:
            return self.model(x, y, z=z)[1]
        hidden = self.model.hidden(x, z)  # (B, T, d_model)
        return chunked_loss(hidden, self.model.lm_head.weight, y, compile=self.compile)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.uses_latents and self.latent.init == "encoder":
            z, encoder_loss = self.semi_amortised_sample(x, y)
            # value 0, gradient the encoder's: the returned loss stays the decoder's
            return self.loss(x, y, z) + (encoder_loss - encoder_loss.detach())
        z = self.posterior_sample(x, y) if self.uses_latents else None
        return self.loss(x, y, z)

    # a Python loop of inner steps (each compiled by itself when asked): kept out of the
    # compiled training step
    @torch.compiler.disable
    def posterior_sample(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One sample z (B, n_layers * n_latent, d_model) of the posterior fitted to (x, y),
        detached: the inner loop's own noise when latent.reuse_noise."""
        post = self.fitter.fit((x, y), latent_shape(self.model.cfg, x.shape[0]))
        return post.sample()

    @torch.compiler.disable
    def semi_amortised_sample(self, x: torch.Tensor,
                              y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(z, encoder_loss): z (B, n_layers * n_latent, d_model) a detached sample of the
        posterior refined from the encoder's start by the inner loop; encoder_loss (0-dim) the
        NELBO per token of the encoder's own q, at the inner loop's noise, whose gradient reaches
        the encoder alone (ltm.latent.encoder.amortised_nelbo)."""
        mu, log_var = encoder_start(self.model, (x, y))  # (B, L, D) each, with gradients
        post = self.fitter.fit((x, y), latent_shape(self.model.cfg, x.shape[0]),
                               start=(mu, log_var))
        nelbo = amortised_nelbo(self.fitter, (x, y), mu, log_var, post.eps)  # (B,)
        return post.sample(), nelbo.sum() / token_counts(y).sum().clamp(min=1)
