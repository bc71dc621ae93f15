"""Cross-entropy, its one home: the mean token loss of an LM head without full-vocabulary
logits (the training loss), the per-row NLL of a frozen head (the latent inner loop's loss),
Liger-Kernel's fused linear cross-entropy (`train.opt.fused_ops: [cross_entropy]`) and the plain
form all of them are tested against.

The plain loss builds logits (N, V) = hidden (N, D) @ weight (V, D)^T, upcasts them to float32 and
keeps them (and their softmax) for the backward pass: at N = 16k tokens and V = 50k that is
3.2 GB per copy. `chunked_cross_entropy` walks the N rows in chunks, and for each chunk computes
the logits, the loss and, right away, the gradients of that chunk with respect to hidden and
weight; the chunk's logits are then dropped. Only the gradients (N, D) and (V, D) are kept for
backward, which merely scales them by the incoming gradient. Peak extra memory is a few copies
of one chunk of logits, (rows, V) with rows * V <= CHUNK_LOGITS, whatever N is.

`fused_row_nll` is the inner loop's form. The latent inner loop (ltm.latent.posterior) needs, per
step, the summed NLL of each sequence and its gradient with respect to the hidden states (to reach
z), never the head's weight gradient. The reference path materialises the (B * T, V) logits in
float32 and lets autograd keep them for the backward: at the GPU profile (16 x 1024 tokens,
V = 50304) that is 3.3 GB written and read several times per inner step. Here the rows go through
the head a chunk at a time; each chunk's logits live only while its NLL and
d(NLL)/d(hidden) = (softmax - onehot) @ W are made, in the forward. The backward only scales the
stored (N, D) gradient by the incoming one, so the cost is two GEMMs per chunk and no logits kept.

    loss = chunked_cross_entropy(hidden, weight, targets)  # hidden (..., D), weight (V, D)
    nll = fused_row_nll(hidden, weight, targets)           # (N,), hidden (N, D), weight (V, D)

fused_row_nll's weight must not require a gradient (the inner loop freezes the decoder): its
gradient is not a per-row quantity that can be stored before the incoming gradient is known.
"""
from __future__ import annotations

import functools
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


# a loop with its own backward, left out of the model's graph; with compile on, it compiles the
# elementwise part of each chunk by itself
chunked_loss = torch.compiler.disable(chunked_cross_entropy)


# --- the inner loop's per-row NLL of a frozen head ----------------------------------------

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


# --- Liger-Kernel's fused linear cross-entropy --------------------------------------------

def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         ignore_index: int) -> torch.Tensor:
    """Mean cross-entropy of hidden @ weight^T against targets (ignore_index left out), Liger's
    fused linear cross-entropy; under autocast both operands in the autocast dtype, the weight's
    gradient accumulated in float32."""
    # Liger-Kernel is optional (train.opt.fused_ops cross_entropy): imported when asked for
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
    device_type = hidden.device.type
    hidden, weight = autocast_operands(hidden, weight)
    with torch.autocast(device_type, enabled=False):
        out = LigerFusedLinearCrossEntropyFunction.apply(
            hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1), None, None,
            ignore_index, 0.0, 0.0, "mean", None, False, torch.float32)
    return (out[0] if isinstance(out, tuple) else out).float()


# a Python loop over chunks with its own backward: kept out of a compiled graph
fused_linear_cross_entropy = torch.compiler.disable(linear_cross_entropy)
