"""The Titans neural long-term memory (Behrouz et al., 2024), every implementation reached from
here.

Per batch and head, a memory M (its weights W: linear [K, V] or an MLP, see memory.py) learns at
test time. For tokens t = 1 .. T with q_t, k_t [K], v_t [V], step size theta_t >= 0, forgetting
alpha_t in [0, 1] and momentum eta_t in [0, 1):

    u_t = grad of 1/2 ||M(k_t) - v_t||^2, taken at the weights the chunk of t started with
          (chunks of chunk_size tokens from position 0: Titans' mini-batch gradient descent;
          chunk_size 1 = the exact per-token gradient at W_{t-1})
    u_t = u_t * min(1, grad_clip / ||u_t||)     (norm over all layers; grad_clip None = no clip)
    S_t = eta_t S_{t-1} - theta_t u_t           (momentum, the "surprise")
    W_t = (1 - alpha_t) W_{t-1} + S_t
    o_t = M_{W_t}(q_t)                          (read after token t's own update)

chunk_size is part of the function, not only of the implementation: every form takes it and
computes the same outputs for it, the token loop included. A sequence shorter than a chunk
updates the memory at every token (all its gradients at the starting weights).

Entry points (what the layers call; `kernel` picks the implementation, see `ltm.ops`):
    titans_memory(q, k, v, theta, alpha, eta, weights, *, kernel, chunk_size, grad_clip,
                  initial_state, output_final_state)
        a sequence: q, k [B, T, H, K]; v [B, T, H, V]; theta, alpha, eta [B, T, H]
    titans_memory_one_token(q, k, v, theta, alpha, eta, weights, state, *, kernel, chunk_size,
                            grad_clip)
        one decoding step: q, k [B, H, K]; v [B, H, V]; theta, alpha, eta [B, H]
weights: the initial memory shared by the batch (learned parameters), [H, d_in, d_out] per layer,
a chain from K to V. States are `TitansState`s: per layer [B, H, d_in, d_out] weights, momenta and
chunk-start weights, float32 (float64 for float64 inputs), and the position.

Implementations: `naive_titans_memory` (naive.py, autograd per token), `chunk_titans_memory`
(chunk.py, "torch") and `titans_memory_step` (step.py) in PyTorch.
    triton  `ltm.kernels.titans.triton_chunk_titans_memory`: the linear memory (one layer),
            chunk_size 16, 32 or 64; `triton_chunk_titans_deep_memory`: the two-layer memory
            (SiLU MLP, any hidden width up to 512), chunk_size 16 or 32; a deeper memory or
            another chunk size is a one-line error.
            The kernels start at a chunk boundary and return no chunk-start weights, so the
            tokens before the first boundary (a state that entered mid-chunk) and, when the state
            is asked for, those after the last one run the chunked PyTorch form: the same
            function, and a state the one-token step continues exactly. One token: the step.
    fla     fla 0.6.0's `chunk_momentum_delta_rule` where it computes this function: the linear
            memory (one layer), chunk_size 1 (its gradient is the exact per-token one at
            W_{t-1}), no clipping (it has none), half-precision inputs (it refuses float32);
            anything else is a one-line error. Mapping: its memory S = W, its momentum M = -S,
            log_alpha = log(1 - alpha), log_mu = log(eta) (both clamped to >= log(1e-6): fla
            takes logs), its eta = theta, beta = 1, p = k, scale 1, no l2-norm inside. In 0.6.0
            that function is a PyTorch reference wrapped in autograd (no Triton kernel), so it is
            a check of the mapping more than a fast path. Its chunked form works with ratios of
            cumulative products in float32 log space: with gates like the mixer's (eta in
            [0.8, 1), alpha < 0.05) it was 1e-4 (float32) and 1e-2 (bfloat16) off the token loop,
            T = 150 (CPU, fla-core 0.6.0); with eta down to 0.05, up to 1e-1 (float32, T = 70),
            while its token-loop reference stayed at 1e-7: the same function, poorer numerics.
    auto    (`ltm.ops.auto`) among the implementations that compute the call's function: triton
            where it runs (then it is the only one), fla or torch in fla's exact case, else torch.
            One token: the step.
"""
from __future__ import annotations

from types import ModuleType
from typing import Sequence

import torch

from ltm.ops import check_kernel, unknown_kernel
from ltm.ops.auto import AUTO, choose
from ltm.ops.titans.chunk import chunk_titans_memory
from ltm.ops.titans.memory import (TitansState, check_inputs, init_titans_state,
                                   triton_chunk_sizes)
from ltm.ops.titans.naive import naive_titans_memory
from ltm.ops.titans.step import titans_memory_step

__all__ = ["TitansState", "chunk_titans_memory", "init_titans_state", "naive_titans_memory",
           "titans_memory", "titans_memory_one_token", "titans_memory_step"]

# fla takes the logs of eta and 1 - alpha: exact zeros would give -inf - -inf = NaN inside it
_FLA_LOG_FLOOR = 1e-6


def _check_fla(weights, chunk_size: int, grad_clip: float | None, dtype: torch.dtype) -> None:
    """One-line error unless fla's momentum delta rule computes this op's function here."""
    check_kernel("fla")
    if len(weights) != 1 or chunk_size != 1 or grad_clip is not None:
        raise ValueError("kernel: 'fla' computes the titans memory only for the linear memory, "
                         f"chunk_size 1 and no grad_clip (got {len(weights)} layers, chunk_size "
                         f"{chunk_size}, grad_clip {grad_clip}); use 'torch'")
    if dtype == torch.float32:
        raise ValueError("kernel: 'fla' runs the titans memory in bfloat16 or float16 only "
                         "(fla 0.6.0 refuses float32); use 'torch'")


def _fla_titans(q, k, v, theta, alpha, eta, weights, initial_state, output_final_state):
    """The linear memory with chunk_size 1 by fla's chunk_momentum_delta_rule (see the module
    docstring for the mapping)."""
    from fla.ops.momentum_delta_rule import chunk_momentum_delta_rule
    B = q.shape[0]
    state = initial_state or init_titans_state(weights, B)
    fla_state = torch.stack([state.weights[0], -state.momenta[0]]).float()
    log_keep = (1 - alpha).float().clamp_min(_FLA_LOG_FLOOR).log()
    log_mu = eta.float().clamp_min(_FLA_LOG_FLOOR).log()
    # one dtype for q, k, v, as fla asserts: v's (bf16 under autocast, where the normalised q, k
    # come out float32)
    o, final = chunk_momentum_delta_rule(
        q.to(v.dtype), k.to(v.dtype), v, log_keep, log_mu, p=None, beta=torch.ones_like(log_mu),
        eta=theta.float(), scale=1.0, initial_state=fla_state,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=False,
        use_p_times_alpha=False)
    if not output_final_state:
        return o.to(v.dtype), None
    W, M = final[0], final[1]
    return o.to(v.dtype), TitansState((W,), (-M,), (W,), state.pos + q.shape[1])


def _auto_candidates(weights, chunk_size: int, grad_clip: float | None,
                     dtype: torch.dtype) -> tuple[str, ...]:
    """The implementations that compute this call's function (`_check_triton`, `_check_fla`):
    their cases do not overlap, and torch computes every one."""
    if chunk_size in triton_chunk_sizes(len(weights)):
        return ("triton",)
    exact = len(weights) == 1 and chunk_size == 1 and grad_clip is None
    return ("fla", "torch") if exact and dtype in (torch.bfloat16, torch.float16) else ("torch",)


def _lazy_kernels() -> ModuleType:
    """`ltm.kernels.titans`, imported on first use (Triton loads only when a call asks for it)."""
    from ltm.kernels import titans as kernels
    return kernels


def _check_triton(weights, chunk_size: int) -> None:
    sizes = triton_chunk_sizes(len(weights))
    if not sizes:
        raise ValueError(f"kernel: 'triton' runs the titans memory with 1 or 2 layers (got "
                         f"{len(weights)}); use 'torch'")
    if chunk_size not in sizes:
        raise ValueError(f"kernel: 'triton' runs the {len(weights)}-layer titans memory with "
                         f"chunk_size in {sizes}, got {chunk_size}; use 'torch'")


def _by_kernel(q, k, v, gates, state: TitansState, chunk_size: int, grad_clip: float | None,
               output_final_state: bool):
    """o and the weights and momenta after the tokens (tuples of layers; None unless
    `output_final_state`) by the linear or the two-layer memory's kernel."""
    kernels = _lazy_kernels()
    options = dict(chunk_size=chunk_size, grad_clip=grad_clip,
                   output_final_state=output_final_state)
    if len(state.weights) == 2:
        return kernels.triton_chunk_titans_deep_memory(q, k, v, *gates, state.weights,
                                                       state.momenta, **options)
    o, W, S = kernels.triton_chunk_titans_memory(q, k, v, *gates, state.weights[0],
                                                 state.momenta[0], **options)
    return (o, (W,), (S,)) if output_final_state else (o, None, None)


def _triton_titans(q, k, v, theta, alpha, eta, weights, chunk_size, grad_clip, initial_state,
                   output_final_state):
    """The memory by the Triton kernels from the first chunk boundary to the last (see the module
    docstring), PyTorch's chunked form before and after."""
    B, T = q.shape[:2]
    state = initial_state or init_titans_state(weights, B)
    head = min(T, -state.pos % chunk_size)
    tail = (T - head) % chunk_size if output_final_state else 0
    inputs, outputs = (q, k, v, theta, alpha, eta), []

    def by_torch(start: int, end: int, entering: TitansState) -> TitansState:
        o, leaving = chunk_titans_memory(*(x[:, start:end] for x in inputs), weights,
                                         chunk_size=chunk_size, grad_clip=grad_clip,
                                         initial_state=entering, output_final_state=True)
        outputs.append(o)
        return leaving

    if head:
        state = by_torch(0, head, state)
    if T - head - tail:
        q_in, k_in, v_in, *gates = (x[:, head:T - tail] for x in inputs)
        o, W, S = _by_kernel(q_in.to(v.dtype), k_in.to(v.dtype), v_in, gates, state, chunk_size,
                             grad_clip, output_final_state)
        outputs.append(o)
        if output_final_state:
            state = TitansState(W, S, W, state.pos + T - head - tail)
    if tail:
        state = by_torch(T - tail, T, state)
    o = torch.cat(outputs, dim=1) if len(outputs) > 1 else outputs[0]
    return o, (state if output_final_state else None)


def titans_memory(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    theta: torch.Tensor,
    alpha: torch.Tensor,
    eta: torch.Tensor,
    weights: Sequence[torch.Tensor],
    *,
    kernel: str,
    chunk_size: int,
    grad_clip: float | None = None,
    initial_state: TitansState | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, TitansState | None]:
    """The Titans memory over a sequence by the implementation `kernel` names.

    q, k: [B, T, H, K]; v: [B, T, H, V]; theta, alpha, eta: [B, T, H]; weights: [H, d_in, d_out]
    per layer. Returns o [B, T, H, V] in the dtype of v, and the state after the last token
    when `output_final_state`, else None.
    """
    options = dict(chunk_size=chunk_size, grad_clip=grad_clip, initial_state=initial_state,
                   output_final_state=output_final_state)
    if kernel == AUTO:
        kernel = choose("titans", q, v, (q, k, v, theta, alpha, eta, *weights),
                        candidates=_auto_candidates(weights, chunk_size, grad_clip, v.dtype))
    if kernel == "naive":
        return naive_titans_memory(q, k, v, theta, alpha, eta, weights, **options)
    if kernel == "torch":
        return chunk_titans_memory(q, k, v, theta, alpha, eta, weights, **options)
    if kernel == "triton":
        check_inputs(q, k, v, theta, alpha, eta, weights, initial_state, chunk_size, grad_clip)
        _check_triton(weights, chunk_size)
        return _triton_titans(q, k, v, theta, alpha, eta, weights, chunk_size, grad_clip,
                              initial_state, output_final_state)
    if kernel == "fla":
        _check_fla(weights, chunk_size, grad_clip, v.dtype)
        return _fla_titans(q, k, v, theta, alpha, eta, weights, initial_state, output_final_state)
    raise unknown_kernel(kernel)


def titans_memory_one_token(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    theta: torch.Tensor,
    alpha: torch.Tensor,
    eta: torch.Tensor,
    weights: Sequence[torch.Tensor],
    state: TitansState | None,
    *,
    kernel: str,
    chunk_size: int,
    grad_clip: float | None = None,
) -> tuple[torch.Tensor, TitansState]:
    """One decoding step of the Titans memory by the implementation `kernel` names.

    q, k: [B, H, K]; v: [B, H, V]; theta, alpha, eta: [B, H]; state: a TitansState or None (the
    initial weights). Returns o [B, H, V] in the dtype of v and the new state. "torch", "triton",
    "fla" and "auto" all run `titans_memory_step` (one token is a few small batched matmuls; it also serves the
    deep memory and any chunk_size, which fla's op does not).
    """
    if kernel == "naive":
        o, state = naive_titans_memory(
            q[:, None], k[:, None], v[:, None], theta[:, None], alpha[:, None], eta[:, None],
            weights, chunk_size=chunk_size, grad_clip=grad_clip, initial_state=state,
            output_final_state=True)
        return o[:, 0], state
    if kernel in ("torch", "triton", "fla", AUTO):
        return titans_memory_step(q, k, v, theta, alpha, eta, weights, state,
                                  chunk_size=chunk_size, grad_clip=grad_clip)
    raise unknown_kernel(kernel)
