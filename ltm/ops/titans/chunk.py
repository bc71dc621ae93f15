"""Chunked form of the Titans memory in plain PyTorch: per chunk, every token's gradient at the
chunk's starting weights in one batched pass, then the momentum and forgetting recurrences and
every token's read in closed form; only the hand-off from one chunk to the next is a Python loop
(the deep memory's gradients depend on the weights a chunk starts from, non-linearly).

Inside a chunk of n tokens, with f_t = 1 - alpha_t, e_t = eta_t, g_t = theta_t * clip_t and the
rank-one gradients u_s = x_s delta_s^T of each layer (taken at W_c, see memory.py), unrolling
S_t = e_t S_{t-1} - g_t u_t and W_t = f_t W_{t-1} + S_t from (W_c, S_c) gives

    S_t = E_t S_c - sum_{s<=t} P_ts g_s u_s
    W_t = a_t W_c + b_t S_c - sum_{s<=t} Gamma_ts g_s u_s

with a_t = prod_{r<=t} f_r, E_t = prod_{r<=t} e_r, P_ts = prod_{s<r<=t} e_r, D_ts =
prod_{s<r<=t} f_r, b = D E and Gamma = D P (n x n, lower triangular). No per-token weights are
formed: token t's layer input h_t meets W_t in the dual form

    h_t W_t = a_t h_t W_c + b_t h_t S_c - sum_s Gamma_ts g_s (h_t . x_s) delta_s.

The products come from cumulative products, not from differences of cumulative logs, so eta = 0
or alpha = 1 (a factor of exactly zero) stays exact and differentiable.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from ltm.ops.titans.memory import TitansState, check_inputs, init_titans_state, memory_grads


def transfer(x: torch.Tensor) -> torch.Tensor:
    """[..., n] -> [..., n, n]: prod_{s<r<=t} x_r at (t, s) for t >= s (1 on the diagonal), 0
    above it."""
    n = x.shape[-1]
    below = torch.ones(n, n, dtype=torch.bool, device=x.device).tril(-1)
    factors = torch.where(below, x[..., :, None], torch.ones((), dtype=x.dtype, device=x.device))
    return factors.cumprod(-2) * below.logical_or(torch.eye(n, dtype=torch.bool, device=x.device))


def _chunk(q, k, v, theta, alpha, eta, W, S, W_grad, grad_clip):
    """One chunk: q, k, v [B, H, n, D]; theta, alpha, eta [B, H, n]; W, S (the state entering
    the chunk) and W_grad (where the gradients are taken) per layer [B, H, d_in, d_out].
    Returns the reads [B, H, n, V] and the weights and momenta after the chunk's last token."""
    xs, deltas, clip = memory_grads(W_grad, k, v, grad_clip)
    g = theta * clip  # [B, H, n]
    f, e = 1 - alpha, eta
    a, E = f.cumprod(-1), e.cumprod(-1)
    D, P = transfer(f), transfer(e)
    b = (D @ E[..., None])[..., 0]
    gamma = D @ P  # [B, H, n, n]
    gamma_g = gamma * g[..., None, :]
    h = q
    for layer, (x, delta) in enumerate(zip(xs, deltas)):
        z = (a[..., None] * (h @ W[layer]) + b[..., None] * (h @ S[layer])
             - (gamma_g * (h @ x.transpose(-1, -2))) @ delta)
        h = F.silu(z) if layer < len(W) - 1 else z
    # the state after the last token: row n - 1 of the same sums
    last_w, last_s = gamma_g[..., -1, :, None], (P[..., -1, :] * g)[..., None]
    W_new = tuple(a[..., -1, None, None] * w + b[..., -1, None, None] * s
                  - x.transpose(-1, -2) @ (last_w * d) for w, s, x, d in zip(W, S, xs, deltas))
    S_new = tuple(E[..., -1, None, None] * s - x.transpose(-1, -2) @ (last_s * d)
                  for s, x, d in zip(S, xs, deltas))
    return h, W_new, S_new


def chunk_titans_memory(
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
    """The Titans memory over a sequence, parallel inside chunks; the same function as
    `naive_titans_memory` (see `ltm.ops.titans`), differentiable by autograd in every input, the
    initial weights and the initial state's tensors.

    q, k: [B, T, H, K]; v: [B, T, H, V]; theta, alpha, eta: [B, T, H]; weights: the initial
    memory, [H, d_in, d_out] per layer (used when initial_state is None). Returns o [B, T, H, V]
    in the dtype of v, and the state after the last token when `output_final_state`.
    """
    check_inputs(q, k, v, theta, alpha, eta, weights, initial_state, chunk_size, grad_clip)
    B, T = q.shape[:2]
    dtype, out_dtype = torch.promote_types(q.dtype, torch.float32), v.dtype
    state = initial_state or init_titans_state(weights, B, dtype)
    W, S, W_grad = (tuple(x.to(dtype) for x in part) for part in state[:3])
    q, k, v, theta, alpha, eta = (x.to(dtype).transpose(1, 2) for x in (q, k, v, theta, alpha, eta))
    outputs, start = [], 0
    # float32 (float64) throughout, autocast or not: under bf16 autocast the matmuls would round
    # the memory's weights and momenta to bf16 at every chunk
    with torch.autocast(q.device.type, enabled=False):
        while start < T:
            # chunks are counted from position 0 of the sequence, also after a prefill
            offset = (state.pos + start) % chunk_size
            end = min(T, start + chunk_size - offset)
            if offset == 0:
                W_grad = W
            part = slice(start, end)
            o, W, S = _chunk(q[:, :, part], k[:, :, part], v[:, :, part], theta[:, :, part],
                             alpha[:, :, part], eta[:, :, part], W, S, W_grad, grad_clip)
            outputs.append(o)
            start = end
    o = torch.cat(outputs, dim=2).transpose(1, 2).to(out_dtype)
    if not output_final_state:
        return o, None
    pos = state.pos + T
    return o, TitansState(W, S, W if pos % chunk_size == 0 else W_grad, pos)
