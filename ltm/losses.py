"""The training objective: cross-entropy over the tied output head without full-vocabulary
logits, the inner loop that fits latent thoughts, and LossModel, the model with its loss.

The plain loss builds logits (N, V) = hidden (N, D) @ weight (V, D)^T, upcasts them to float32 and
keeps them (and their softmax) for the backward pass: at N = 16k tokens and V = 50k that is
3.2 GB per copy. `chunked_cross_entropy` walks the N rows in chunks, and for each chunk computes
the logits, the loss and, right away, the gradients of that chunk with respect to hidden and
weight; the chunk's logits are then dropped. Only the gradients (N, D) and (V, D) are kept for
backward, which merely scales them by the incoming gradient. Peak extra memory is a few copies
of one chunk of logits, (rows, V) with rows * V <= CHUNK_LOGITS, whatever N is.

`cross_entropy_reference` is the plain form the chunked one is tested against.

With latent thoughts, each sequence's latent vectors come from a short optimisation of their
posterior (ltm.latent, the fast loop) before the decoder's step (the slow loop).
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from ltm.latent import LatentConfig
    from ltm.model import LTM

IGNORE_INDEX = -100


def cross_entropy_reference(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                            ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Mean cross-entropy of logits hidden @ weight^T, materialised in full. hidden (..., D),
    weight (V, D), targets (...) int64."""
    logits = hidden.reshape(-1, hidden.shape[-1]) @ weight.t()  # (N, V)
    return F.cross_entropy(logits.float(), targets.reshape(-1), ignore_index=ignore_index)


# logits per chunk (rows * vocab), 256 MiB in float32: small next to full logits, large enough
# that the weight gradient, accumulated once per chunk, costs few passes over (V, D)
CHUNK_LOGITS = 1 << 26


def default_chunk_rows(num_rows: int, vocab_size: int) -> int:
    return max(1, min(num_rows, CHUNK_LOGITS // vocab_size))


def _loss_and_grad_logits(logits: torch.Tensor, t: torch.Tensor, ignore_index: int,
                          want_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Summed loss of one chunk of logits (R, V) with targets t (R,), and d(sum loss)/d(logits)
    in the logits' dtype (or None). Elementwise work only: the part worth compiling."""
    logits32 = logits.float()
    lse = torch.logsumexp(logits32, dim=-1)  # (R,)
    valid = t != ignore_index
    safe_t = torch.where(valid, t, torch.zeros_like(t))
    target_logit = logits32.gather(1, safe_t[:, None]).squeeze(1)  # (R,)
    loss_sum = torch.where(valid, lse - target_logit, torch.zeros_like(lse)).sum()
    if not want_grad:
        return loss_sum, None
    # softmax - onehot(target); a row left out gets lse = inf, so its softmax is exactly 0
    grad = torch.exp(logits32 - torch.where(valid, lse, torch.full_like(lse, math.inf))[:, None])
    grad = grad.index_put((torch.arange(len(t), device=t.device), safe_t), -valid.float(),
                          accumulate=True)
    return loss_sum, grad.to(logits.dtype)


@functools.cache
def _compiled_loss_and_grad_logits():
    # made on first use: importing the compiler stack costs seconds that most runs do not need
    return torch.compile(_loss_and_grad_logits)


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Forward computes the loss and its gradients chunk by chunk; saves only the gradients."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_rows: int, ignore_index: int, compile: bool):
        want_grads = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        elementwise = _compiled_loss_and_grad_logits() if compile else _loss_and_grad_logits
        grad_hidden = torch.full_like(hidden, math.nan) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk_rows):
            h, t = hidden[start:start + chunk_rows], targets[start:start + chunk_rows]
            chunk_loss, grad_logits = elementwise(h @ weight.t(), t, ignore_index, want_grads)
            loss_sum += chunk_loss
            if grad_hidden is not None:
                grad_hidden[start:start + chunk_rows] = grad_logits @ weight  # (R, D)
            if want_grads:
                grad_weight += grad_logits.t() @ h  # (V, D)
        count = (targets != ignore_index).sum().clamp(min=1)
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype), count)
        return loss_sum / count

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight, count = ctx.saved_tensors
        scale = grad_loss / count
        dh = grad_hidden * scale.to(grad_hidden.dtype) if ctx.needs_input_grad[0] else None
        dw = grad_weight * scale.to(grad_weight.dtype) if ctx.needs_input_grad[1] else None
        return dh, dw, None, None, None, None


def autocast_operands(hidden: torch.Tensor,
                      weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden and weight in the dtype their matmul would take under the autocast state now (the
    autocast dtype when it is on, else hidden's): for a loss that runs its matmuls with autocast
    off."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        return hidden.to(dtype), weight.to(dtype)
    return hidden, weight.to(hidden.dtype)


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          chunk_rows: int | None = None, ignore_index: int = IGNORE_INDEX,
                          compile: bool = False) -> torch.Tensor:
    """Mean cross-entropy of logits hidden @ weight^T (rows with target == ignore_index left out),
    computed in chunks of rows so that full (N, V) float32 logits never exist.

    hidden: (..., D) float32, bfloat16 or float16; weight: (V, D) (the tied embedding / head);
    targets: (...) int64 with the leading shape of hidden. Under autocast both operands are cast
    to the autocast dtype, as a plain matmul would be. The logits, log-sum-exp and loss are float32.
    chunk_rows: rows per chunk, default CHUNK_LOGITS // V. compile: torch.compile the elementwise
    part of each chunk (log-sum-exp, softmax, one-hot), one fused pass instead of several.
    Returns a float32 scalar, differentiable with respect to hidden and weight.
    """
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"targets: expected shape {tuple(hidden.shape[:-1])} (hidden without its "
                         f"last dim), got {tuple(targets.shape)}")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"weight: expected shape (V, {hidden.shape[-1]}), got {tuple(weight.shape)}")
    if targets.dtype != torch.int64:
        raise ValueError(f"targets: expected dtype torch.int64, got {targets.dtype}")
    device_type = hidden.device.type
    hidden, weight = autocast_operands(hidden, weight)
    hidden = hidden.reshape(-1, hidden.shape[-1])  # (N, D)
    targets = targets.reshape(-1)  # (N,)
    if chunk_rows is None:
        chunk_rows = default_chunk_rows(hidden.shape[0], weight.shape[0])
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows: expected a positive int, got {chunk_rows}")
    # the casts above are autocast's job done by hand; inside, every op runs in the given dtypes
    with torch.autocast(device_type, enabled=False):
        return _ChunkedCrossEntropy.apply(hidden, weight, targets, chunk_rows, ignore_index, compile)


class LossModel(nn.Module):
    """The model plus its loss, as one module, so DDP and torch.compile see the whole step.

    With latent thoughts (model.n_latent > 0 and latent.steps > 0) each batch first gets its
    posterior q(z) from the inner loop (ltm.latent.PosteriorFitter: latent.steps steps on the
    negative ELBO, only q's parameters updated), then the decoder's loss is the mean token
    cross-entropy given one sample of q, detached: the slow step, as in Latent Thought Models.
    latent: the train.latent section (None = its defaults); compile also compiles the inner step
    when latent.compile is auto. fused_ce: Liger-Kernel's fused linear cross-entropy
    (train.opt.fused_ops cross_entropy, ltm.fused) instead of either loss above."""

    def __init__(self, model: LTM, fused_loss: bool, compile: bool,
                 latent: LatentConfig | None = None, fused_ce: bool = False) -> None:
        # imported here: ltm.latent imports IGNORE_INDEX from this module
        from ltm.latent import LatentConfig, decoder_fitter
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
            from ltm.fused import fused_linear_cross_entropy  # imports Triton: only when asked
            return fused_linear_cross_entropy(self.model.hidden(x, z), self.model.lm_head.weight,
                                              y, IGNORE_INDEX)
        if not self.fused_loss:
            return self.model(x, y, z=z)[1]
        hidden = self.model.hidden(x, z)  # (B, T, d_model)
        return chunked_loss(hidden, self.model.lm_head.weight, y, compile=self.compile)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = self.posterior_sample(x, y) if self.uses_latents else None
        return self.loss(x, y, z)

    # a Python loop of inner steps (each compiled by itself when asked): kept out of the
    # compiled training step
    @torch.compiler.disable
    def posterior_sample(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One sample z (B, n_layers * n_latent, d_model) of the posterior fitted to (x, y),
        detached: the inner loop's own noise when latent.reuse_noise."""
        from ltm.latent import latent_shape
        post = self.fitter.fit((x, y), latent_shape(self.model.cfg, x.shape[0]))
        return post.sample()


# a loop with its own backward, left out of the model's graph; with compile on, it compiles the
# elementwise part of each chunk by itself
chunked_loss = torch.compiler.disable(chunked_cross_entropy)
