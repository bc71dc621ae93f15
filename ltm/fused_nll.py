"""Token NLL of a frozen LM head without full-vocabulary logits: the inner loop's loss.

The latent inner loop (ltm.latent) needs, per step, the summed NLL of each sequence and its
gradient with respect to the hidden states (to reach z), never the head's weight gradient. The
reference path materialises the (B * T, V) logits in float32 and lets autograd keep them for the
backward: at the GPU profile (16 x 1024 tokens, V = 50304) that is 3.3 GB written and read several
times per inner step. Here the rows go through the head a chunk at a time; each chunk's logits
live only while its NLL and d(NLL)/d(hidden) = (softmax - onehot) @ W are made, in the forward.
The backward only scales the stored (N, D) gradient by the incoming one (the NLL of a row is
linear in nothing else), so the cost is two GEMMs per chunk and no logits kept.

    nll = fused_row_nll(hidden, weight, targets)   # (N,), hidden (N, D), weight (V, D)

The weight must not require a gradient (the inner loop freezes the decoder): its gradient is not
a per-row quantity that can be stored before the incoming gradient is known.
"""
from __future__ import annotations

import torch

from ltm.losses import CHUNK_LOGITS, IGNORE_INDEX


def _chunk_nll_and_grad(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                        want_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """NLL per row (R,) float32 of hidden (R, D) through weight (V, D), and d(NLL_r)/d(hidden_r)
    (R, D) in hidden's dtype, or None."""
    logits = (hidden @ weight.to(hidden.dtype).t()).float()  # (R, V)
    lse = torch.logsumexp(logits, dim=-1)  # (R,)
    valid = targets != IGNORE_INDEX
    safe = torch.where(valid, targets, torch.zeros_like(targets))
    nll = torch.where(valid, lse - logits.gather(1, safe[:, None])[:, 0], torch.zeros_like(lse))
    if not want_grad:
        return nll, None
    probs = torch.exp(logits - lse[:, None])  # (R, V) softmax
    probs.scatter_add_(1, safe[:, None], -torch.ones_like(lse)[:, None])  # - onehot(target)
    probs = probs * valid[:, None]  # an ignored row contributes nothing
    return nll, probs.to(hidden.dtype) @ weight.to(hidden.dtype)  # (R, D)


class _FusedRowNLL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                chunk_rows: int) -> torch.Tensor:
        want_grad = ctx.needs_input_grad[0]
        nll, grads = [], []
        for start in range(0, hidden.shape[0], chunk_rows):
            stop = start + chunk_rows
            row_nll, grad = _chunk_nll_and_grad(hidden[start:stop], weight, targets[start:stop],
                                                want_grad)
            nll.append(row_nll)
            grads.append(grad)
        if want_grad:
            ctx.save_for_backward(torch.cat(grads))
        return torch.cat(nll)

    @staticmethod
    def backward(ctx, grad_nll: torch.Tensor):
        (grad_hidden,) = ctx.saved_tensors  # (N, D): d(NLL_r)/d(hidden_r)
        return grad_hidden * grad_nll[:, None].to(grad_hidden.dtype), None, None, None


def fused_row_nll(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                  chunk_rows: int | None = None) -> torch.Tensor:
    """NLL of each row (N,) float32: hidden (N, D), weight (V, D) frozen, targets (N,) with
    IGNORE_INDEX rows at 0. Differentiable in hidden only. chunk_rows: rows per chunk of logits
    (default: CHUNK_LOGITS // V, 256 MiB of float32 logits)."""
    if weight.requires_grad:
        raise ValueError("fused_row_nll: the head's weight must be frozen (requires_grad False)")
    rows = chunk_rows or max(1, CHUNK_LOGITS // weight.shape[0])
    return _FusedRowNLL.apply(hidden, weight, targets, rows)
