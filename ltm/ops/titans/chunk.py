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


def gate_products(f: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """f = 1 - alpha, e = eta [..., n] (a chunk's tokens) -> a, E, b [..., n] and P, Gamma
    [..., n, n] (see the module docstring). Any leading dims: all chunks of a sequence at once."""
    a, E = f.cumprod(-1), e.cumprod(-1)
    D, P = transfer(f), transfer(e)
    b = (D @ E[..., None])[..., 0]
    return a, E, b, P, D @ P


def _padded(x: torch.Tensor, chunk: int, value: float = 0.0) -> torch.Tensor:
    """[B, H, T, ...] -> [B, H, NC, chunk, ...], the last chunk padded with `value`."""
    pad = -x.shape[2] % chunk
    return F.pad(x, (0, 0) * (x.dim() - 3) + (0, pad), value=value).unflatten(2, (-1, chunk))


def chunk_gate_products(alpha: torch.Tensor, eta: torch.Tensor, chunk: int
                        ) -> tuple[torch.Tensor, ...]:
    """Per chunk of alpha, eta [B, H, T], all chunks at once: a, b [B, H, NC, chunk], Gamma
    [B, H, NC, chunk, chunk] and, at each chunk's last token L, (a_L, b_L, E_L) [B, H, NC, 3] and
    the rows Gamma_L and P_L [B, H, NC, chunk] (see the module docstring). The last chunk is
    padded with tokens that forget nothing and keep all momentum: a token's products read no
    later token, and L is its last real token."""
    T = alpha.shape[-1]
    f, e = _padded(1 - alpha, chunk, 1.0), _padded(eta, chunk, 1.0)  # [B, H, NC, chunk]
    a, E, b, P, gamma = gate_products(f, e)
    chunks = torch.arange(f.shape[2], device=f.device)
    last = (T - 1 - chunks * chunk).clamp(max=chunk - 1)
    ends = torch.stack([x[:, :, chunks, last] for x in (a, b, E)], -1)
    return a, b, gamma, ends, gamma[:, :, chunks, last], P[:, :, chunks, last]


def _chunk(q, k, v, theta, gates, W, S, W_grad, grad_clip):
    """One chunk: q, k, v [B, H, n, D]; theta [B, H, n]; gates its `chunk_gate_products`; W, S (the
    state entering the chunk) and W_grad (where the gradients are taken) per layer [B, H, d_in,
    d_out]. Returns the reads [B, H, n, V] and the weights and momenta after its last token."""
    xs, deltas, clip = memory_grads(W_grad, k, v, grad_clip)
    g = theta * clip  # [B, H, n]
    a, b, gamma, ends, gamma_last, p_last = gates
    gamma_g = gamma * g[..., None, :]
    h = q
    for layer, (x, delta) in enumerate(zip(xs, deltas)):
        z = (a[..., None] * (h @ W[layer]) + b[..., None] * (h @ S[layer])
             - (gamma_g * (h @ x.transpose(-1, -2))) @ delta)
        h = F.silu(z) if layer < len(W) - 1 else z
    # the state after the last token: row L of the same sums
    a_last, b_last, e_last = (x[..., None, None] for x in ends.unbind(-1))
    last_w, last_s = (gamma_last * g)[..., None], (p_last * g)[..., None]
    W_new = tuple(a_last * w + b_last * s - x.transpose(-1, -2) @ (last_w * d)
                  for w, s, x, d in zip(W, S, xs, deltas))
    S_new = tuple(e_last * s - x.transpose(-1, -2) @ (last_s * d) for s, x, d in zip(S, xs, deltas))
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
    outputs = []
    # float32 (float64) throughout, autocast or not: under bf16 autocast the matmuls would round
    # the memory's weights and momenta to bf16 at every chunk
    with torch.autocast(q.device.type, enabled=False):
        # chunks are counted from position 0 of the sequence, also after a prefill: a state that
        # entered mid-chunk first finishes its chunk (the head), as a chunk of its own length
        head = min(T, -state.pos % chunk_size)
        parts = [(0, head, head)] if head else []
        parts += [(head, T, chunk_size)] if head < T else []
        for start, end, chunk in parts:
            # one unbind per input, not a slice per chunk: the backward of an unbind is one stack,
            # that of each slice a zero-filled tensor the size of the whole (the small models on
            # a CPU are bound by such launches)
            part = (x[:, :, start:end] if end - start < T else x for x in (q, k, v, theta, alpha, eta))
            *inputs, alpha_part, eta_part = part
            gates = list(zip(*(x.unbind(2) for x in chunk_gate_products(alpha_part, eta_part,
                                                                          chunk))))
            for *chunk_inputs, chunk_gates in zip(*(_padded(x, chunk).unbind(2) for x in inputs),
                                                  gates):
                if start == head:
                    W_grad = W  # a chunk's gradients are taken at the weights it starts with
                o, W, S = _chunk(*chunk_inputs, chunk_gates, W, S, W_grad, grad_clip)
                outputs.append(o)
    # the last chunk's padded rows go
    o = torch.cat(outputs, dim=2)[:, :, :T].transpose(1, 2).to(out_dtype)
    if not output_final_state:
        return o, None
    pos = state.pos + T
    return o, TitansState(W, S, W if pos % chunk_size == 0 else W_grad, pos)
