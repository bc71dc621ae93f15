"""Token-by-token reference of the Titans memory. Slow on purpose: the gradient of the associative
loss comes from autograd (torch.func.grad, per batch and head by vmap), not from the explicit
formula the chunked form and the step use, so it checks that formula too."""
from __future__ import annotations

from typing import Sequence

import torch
from torch.func import grad, vmap

from ltm.ops.titans.memory import TitansState, check_inputs, init_titans_state, memory_read


def _loss(weights: tuple, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """1/2 ||M(k) - v||^2 of one head: weights [d_in, d_out] per layer, key [K], value [V]."""
    return 0.5 * (memory_read(weights, key[None])[0] - value).square().sum()


def _at_chunk_start(pos, chunk_size: int, H: int, weights: tuple, chunk_weights: tuple) -> tuple:
    """The weights at which the token at `pos` takes its gradient: `weights` where a chunk starts,
    else `chunk_weights`; pos an int or a (B,) tensor (rows are (batch, head) pairs here)."""
    if not torch.is_tensor(pos):
        return weights if pos % chunk_size == 0 else chunk_weights
    start = (pos % chunk_size == 0).repeat_interleave(H)[:, None, None]
    return tuple(torch.where(start, w, c) for w, c in zip(weights, chunk_weights))


def naive_titans_memory(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    theta: torch.Tensor,
    alpha: torch.Tensor,
    eta: torch.Tensor,
    weights: Sequence[torch.Tensor],
    *,
    chunk_size: int = 64,
    grad_clip: float | None = None,
    initial_state: TitansState | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, TitansState | None]:
    """The Titans memory, one token at a time. Per batch and head, for t = 0 .. T-1:

        W_c = W                    at the start of each chunk (pos + t a multiple of chunk_size)
        u = grad of 1/2 ||M_{W_c}(k_t) - v_t||^2 w.r.t. W_c, scaled by min(1, grad_clip / ||u||)
        S = eta_t S - theta_t u;   W = (1 - alpha_t) W + S;   o_t = M_W(q_t)

    Arguments and returns as `chunk_titans_memory`; the initial state's pos may also be a (B,)
    tensor here (each row at its own position, as static-cache decoding keeps them).
    """
    check_inputs(q, k, v, theta, alpha, eta, weights, initial_state, chunk_size, grad_clip,
                 tensor_pos=True)
    B, T, H = q.shape[:3]
    dtype, out_dtype = torch.promote_types(q.dtype, torch.float32), v.dtype
    state = initial_state or init_titans_state(weights, B, dtype)
    # one row per (batch, head): [B * H, d_in, d_out] per layer, [B * H, D] per token
    W, S, W_grad = (tuple(x.to(dtype).flatten(0, 1) for x in part) for part in state[:3])
    q, k, v = (x.to(dtype).transpose(1, 2).flatten(0, 1) for x in (q, k, v))
    theta, alpha, eta = (x.to(dtype).transpose(1, 2).flatten(0, 1)[..., None, None]
                         for x in (theta, alpha, eta))
    grads_of = vmap(grad(_loss))
    outputs = []
    for t in range(T):
        W_grad = _at_chunk_start(state.pos + t, chunk_size, H, W, W_grad)
        # float32 (float64) state also under autocast
        with torch.autocast(q.device.type, enabled=False):
            u = grads_of(W_grad, k[:, t], v[:, t])
            scale = 1.0
            if grad_clip is not None:
                norm_sq = sum(g.square().sum((-1, -2)) for g in u)[:, None, None]
                scale = grad_clip * torch.rsqrt(norm_sq.clamp_min(grad_clip ** 2))
            S = tuple(eta[:, t] * s - theta[:, t] * scale * g for s, g in zip(S, u))
            W = tuple((1 - alpha[:, t]) * w + s for w, s in zip(W, S))
            outputs.append(memory_read(W, q[:, t, None])[:, 0])
    o = torch.stack(outputs, dim=1).unflatten(0, (B, H)).transpose(1, 2).to(out_dtype)
    if not output_final_state:
        return o, None
    pos = state.pos + T
    W_grad = _at_chunk_start(pos, chunk_size, H, W, W_grad)
    W, S, W_grad = (tuple(x.unflatten(0, (B, H)) for x in part) for part in (W, S, W_grad))
    return o, TitansState(W, S, W_grad, pos)
