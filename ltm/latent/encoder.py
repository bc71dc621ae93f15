"""Semi-amortised inference (train.latent.init encoder): a small network reads a sequence and
predicts where its q(z) = N(mu, exp(log_var)) starts; the inner loop's steps then refine it.

The network: one learned query per latent slot (n_layers * n_latent of them) cross-attends to the
sequence's input tokens as the decoder embeds them, detached (the embedding is the decoder's and
stays trained by the decoder's loss alone), then an MLP, `encoder_layers` such blocks, then one
linear head to (mu, log_var) per slot. The head starts at zero: an untrained encoder predicts the
prior N(0, I) for every sequence, so init encoder starts where init prior does. No positions:
the queries see the sequence as a bag of token pairs (each token with the one before it), the
cheapest reading with some order in it; the rest of the order the inner steps find.

Training (the cheap recipe of semi-amortised VAEs without backpropagating through the refinement,
Kim et al. 2018 "SA-VAE", as in Krishnan et al. 2018): the decoder trains on a sample of the
refined q, as with any init; the encoder trains on the negative ELBO of its own q (one
reparameterised sample, the inner loop's noise, and the closed-form KL to N(0, I)), which sends no
gradient to the decoder (`amortised_nelbo`). Both terms go to the same outer optimiser: the
encoder is a submodule of the LTM (`attach_encoder`), so it is counted, saved in checkpoints and
restored by ltm.train.checkpoint.load_model. Its cost per training step: one forward and one
backward to z through the frozen decoder (an inner step's), plus the encoder's own (small).

    attach_encoder(model, LatentConfig(init="encoder"))     # model.encoder, trained with the model
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ltm.latent.posterior import LatentConfig, PosteriorFitter, frozen, gaussian_kl
from ltm.model.config import ModelConfig
from ltm.model.lm import LTM, RMSNorm, SwiGLU


class EncoderBlock(nn.Module):
    """Pre-norm residual block of the encoder: the slots (queries) attend to the tokens, then an
    MLP on each slot."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.query_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.kv_proj = nn.Linear(cfg.d_model, 2 * cfg.d_model, bias=False)
        self.out_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """h (B, S, D) slots, tokens (B, T, D) normed embeddings -> (B, S, D)."""
        B, S, D = h.shape
        q = self.q_proj(self.query_norm(h)).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)
        k, v = self.kv_proj(tokens).view(B, -1, 2, self.n_heads, self.head_dim).unbind(2)
        y = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2))  # (B, H, S, hd)
        h = h + self.out_proj(y.transpose(1, 2).reshape(B, S, D))
        return h + self.mlp(self.mlp_norm(h))


class LatentEncoder(nn.Module):
    """q's start from a sequence: embeddings (B, T, d_model) -> (mu, log_var), each
    (B, n_layers * n_latent, d_model), the layout of z."""

    def __init__(self, cfg: ModelConfig, layers: int):
        super().__init__()
        slots = cfg.n_layers * cfg.n_latent
        # unit scale: each slot's query is normed before use, only its direction matters
        self.queries = nn.Parameter(torch.randn(slots, cfg.d_model))
        self.token_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        # each token read with the one before it: the order of pairs, not a bag of tokens
        self.pair = nn.Linear(2 * cfg.d_model, cfg.d_model, bias=False)
        self.pair_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.blocks = nn.ModuleList(EncoderBlock(cfg) for _ in range(layers))
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, 2 * cfg.d_model)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=cfg.init_std)
        # zero head: an untrained encoder predicts the prior, mu = 0 and log_var = 0
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, embedded: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.token_norm(embedded)  # (B, T, D)
        previous = F.pad(tokens, (0, 0, 1, 0))[:, :-1]  # (B, T, D), zeros before the first
        tokens = self.pair_norm(self.pair(torch.cat([tokens, previous], dim=-1)))  # (B, T, D)
        h = self.queries.expand(embedded.shape[0], -1, -1).to(tokens.dtype)  # (B, S, D)
        for block in self.blocks:
            h = block(h, tokens)
        mu, log_var = self.head(self.final_norm(h)).chunk(2, dim=-1)  # (B, S, D) each
        return mu, log_var


def attach_encoder(model: LTM, cfg: LatentConfig) -> LTM:
    """model, with model.encoder (a LatentEncoder of cfg.encoder_layers blocks, on the model's
    device) when cfg.init is encoder and the model has latents and no encoder yet; else as it is
    (no parameter, no random draw)."""
    if cfg.init == "encoder" and model.cfg.n_latent > 0 and model.encoder is None:
        model.encoder = LatentEncoder(model.cfg, cfg.encoder_layers).to(model.embed.weight.device)
    return model


def amortised_nelbo(fitter: PosteriorFitter, data: tuple, mu: torch.Tensor,
                    log_var: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """NELBO per sequence (B,) of q = N(mu, exp(log_var)) (B, L, D) at the sample
    z = mu + sigma * eps, its gradient reaching mu and log_var (and the encoder that made them)
    but no decoder weight. The decoder's part runs at once, frozen, as an inner step does (the
    fitter's nll, compiled where the fitter's is): value NLL(z), gradient g = dNLL/dz; then the
    surrogate NLL(z) + <g, z> - <g, z>.detach() has that value and, through z, that gradient.
    Computed here rather than left to the outer backward, the decoder's weights get nothing from
    it whatever checkpointing or DDP do later."""
    mu, log_var = mu.float(), log_var.float()  # the encoder's head may run under autocast
    z = mu + torch.exp(0.5 * log_var) * eps  # (B, L, D)
    with frozen(fitter.decoder), torch.enable_grad():
        leaf = z.detach().requires_grad_()
        nll = fitter.step_nll(leaf, *data)  # (B,)
        (grad,) = torch.autograd.grad(nll.sum(), leaf)
    linear = (grad * z).flatten(1).sum(1)  # (B,); minus its detached self: value 0, gradient g
    return nll.detach() + linear - linear.detach() + gaussian_kl(mu, log_var)
