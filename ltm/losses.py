"""Cross-entropy over a tied output head without full-vocabulary logits.

The plain loss builds logits (N, V) = hidden (N, D) @ weight (V, D)^T, upcasts them to float32 and
keeps them (and their softmax) for the backward pass: at N = 16k tokens and V = 50k that is
3.2 GB per copy. `chunked_cross_entropy` walks the N rows in chunks, and for each chunk computes
the logits, the loss and, right away, the gradients of that chunk with respect to hidden and
weight; the chunk's logits are then dropped. Only the gradients (N, D) and (V, D) are kept for
backward, which merely scales them by the incoming gradient. Peak extra memory is one chunk of
float32 logits, (rows, V), instead of (N, V).

`cross_entropy_reference` is the plain form the chunked one is tested against.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def cross_entropy_reference(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                            ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Mean cross-entropy of logits hidden @ weight^T, materialised in full. hidden (..., D),
    weight (V, D), targets (...) int64."""
    logits = hidden.reshape(-1, hidden.shape[-1]) @ weight.t()  # (N, V)
    return F.cross_entropy(logits.float(), targets.reshape(-1), ignore_index=ignore_index)


def default_chunk_rows(num_rows: int, vocab_size: int, dim: int) -> int:
    """Rows per chunk so that one chunk of logits (rows, V) is about as large as hidden (N, D):
    the loss then never needs much more memory than the activations it is computed from."""
    chunks = max(1, math.ceil(vocab_size / dim))
    return max(1, math.ceil(num_rows / chunks))


def _chunk_loss_and_grads(h: torch.Tensor, weight: torch.Tensor, t: torch.Tensor,
                          ignore_index: int, want_grads: bool):
    """Summed loss of one chunk and, if wanted, d(sum loss)/dh and d(sum loss)/dweight.
    h (R, D), weight (V, D), t (R,)."""
    logits = (h @ weight.t()).float()  # (R, V)
    lse = torch.logsumexp(logits, dim=-1)  # (R,)
    valid = t != ignore_index
    safe_t = torch.where(valid, t, torch.zeros_like(t))
    target_logit = logits.gather(1, safe_t[:, None]).squeeze(1)  # (R,)
    loss_sum = ((lse - target_logit) * valid).sum()
    if not want_grads:
        return loss_sum, None, None
    # d(loss)/d(logits) = softmax - onehot(target), zero on ignored rows; reuse the logits buffer
    grad_logits = logits.sub_(lse[:, None]).exp_()
    grad_logits[torch.arange(len(t), device=t.device), safe_t] -= 1.0
    grad_logits.mul_(valid[:, None])
    grad_logits = grad_logits.to(h.dtype)
    grad_h = grad_logits @ weight  # (R, D)
    grad_w = (grad_logits.t() @ h).float()  # (V, D)
    return loss_sum, grad_h, grad_w


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Forward computes the loss and its gradients chunk by chunk; saves only the gradients."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_rows: int, ignore_index: int):
        want_grads = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk_rows):
            rows = slice(start, start + chunk_rows)
            chunk_loss, grad_h, grad_w = _chunk_loss_and_grads(
                hidden[rows], weight, targets[rows], ignore_index, want_grads)
            loss_sum += chunk_loss
            if grad_hidden is not None:
                grad_hidden[rows] = grad_h
            if want_grads:
                grad_weight += grad_w
        count = (targets != ignore_index).sum().clamp(min=1)
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype), count)
        return loss_sum / count

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight, count = ctx.saved_tensors
        scale = grad_loss / count
        dh = grad_hidden * scale.to(grad_hidden.dtype) if ctx.needs_input_grad[0] else None
        dw = grad_weight * scale.to(grad_weight.dtype) if ctx.needs_input_grad[1] else None
        return dh, dw, None, None, None


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          chunk_rows: int | None = None,
                          ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Mean cross-entropy of logits hidden @ weight^T (rows with target == ignore_index left out),
    computed in chunks of rows so that full (N, V) float32 logits never exist.

    hidden: (..., D) float32, bfloat16 or float16; weight: (V, D) (the tied embedding / head);
    targets: (...) int64 with the leading shape of hidden. Under autocast both operands are cast
    to the autocast dtype, as a plain matmul would be. The logits, log-sum-exp and loss are float32.
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
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    elif weight.dtype != hidden.dtype:
        weight = weight.to(hidden.dtype)
    hidden = hidden.reshape(-1, hidden.shape[-1])  # (N, D)
    targets = targets.reshape(-1)  # (N,)
    if chunk_rows is None:
        chunk_rows = default_chunk_rows(hidden.shape[0], weight.shape[0], hidden.shape[1])
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows: expected a positive int, got {chunk_rows}")
    # the casts above are autocast's job done by hand; inside, every op runs in the given dtypes
    with torch.autocast(device_type, enabled=False):
        return _ChunkedCrossEntropy.apply(hidden, weight, targets, chunk_rows, ignore_index)
