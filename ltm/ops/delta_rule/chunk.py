"""Chunked (parallel) form of the gated delta rule in plain PyTorch.

Within a chunk of C tokens the product of the per-token transitions
(I - beta_t k_t k_t^T) exp(g_t) is kept in WY / UT-transform form: one unit lower-triangular solve
per chunk gives U (the value part) and W (the state part) of the per-token updates
d_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t) = u_t - w_t^T S_0, so that everything inside a chunk is
a handful of batched matmuls over all chunks at once. Only the hand-off of the state from one chunk
to the next, S_next = M S + N with M [K, K] and N [K, V] precomputed per chunk, is a Python loop.

Every exponent is a difference G_i - G_j of cumulative log decays with i >= j (masked to -inf
before the exp), so strong decay underflows to zero instead of overflowing.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _check_shapes(q, k, v, beta, g, initial_state, chunk_size) -> None:
    if q.dim() != 4:
        raise ValueError(f"q must be [B, T, H, K], got shape {tuple(q.shape)}")
    B, T, H, K = q.shape
    if k.shape != q.shape:
        raise ValueError(f"k must be [B, T, H, K] = {(B, T, H, K)} like q, got {tuple(k.shape)}")
    if v.dim() != 4 or v.shape[:3] != (B, T, H):
        raise ValueError(f"v must be [B, T, H, V] with B, T, H = {(B, T, H)}, got {tuple(v.shape)}")
    if beta.shape != (B, T, H):
        raise ValueError(f"beta must be [B, T, H] = {(B, T, H)}, got {tuple(beta.shape)}")
    if g is not None and g.shape != (B, T, H):
        raise ValueError(f"g must be [B, T, H] = {(B, T, H)} or None, got {tuple(g.shape)}")
    state_shape = (B, H, K, v.shape[-1])
    if initial_state is not None and initial_state.shape != state_shape:
        raise ValueError(f"initial_state must be [B, H, K, V] = {state_shape} or None, "
                         f"got {tuple(initial_state.shape)}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")


def _to_chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """(B, T, H, ...) -> (B, H, N, C, ...), zero-padded at the end to N * C tokens."""
    pad = -x.shape[1] % chunk_size
    x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad))
    return x.unflatten(1, (-1, chunk_size)).movedim(3, 1)


def _chunk_terms(q, k, v, beta, g):
    """Everything that does not depend on the state entering a chunk, for all chunks at once.

    Inputs are (B, H, N, C, D) / (B, H, N, C). With S the state entering a chunk, the chunk's
    outputs are o_local + q_eff @ S and the state leaving it is M @ S + N.
    """
    C, K = k.shape[-2], k.shape[-1]
    G = g.cumsum(-1)  # (B, H, N, C) cumulative log decay inside the chunk
    below = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1)
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    # (B, H, N, C, C): exp(G_i - G_j) below the diagonal (masked before the exp), 1 on it, 0 above.
    # The diagonal is set, not computed as exp(G_i - G_i): its gradients cancel exactly in theory
    # but not in float32, where they would swamp the small dg of strongly decayed tokens.
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~below, float("-inf")).exp() + eye
    # d_i + sum_{j<i} beta_i exp(G_i - G_j) (k_i . k_j) d_j = beta_i v_i - beta_i exp(G_i) S^T k_i
    lower = eye + (beta[..., None] * decay * (k @ k.transpose(-1, -2))).tril(-1)
    rhs = torch.cat([beta[..., None] * v, (beta * G.exp())[..., None] * k], dim=-1)
    uw = torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
    u, w = uw[..., :v.shape[-1]], uw[..., v.shape[-1]:]  # d = u - w @ S
    scores = (q @ k.transpose(-1, -2)) * decay  # (B, H, N, C, C)
    o_local = scores @ u
    q_eff = q * G.exp()[..., None] - scores @ w
    # keys decayed to the end of the chunk: exp(G_C - G_j) k_j, with G_C - G_j = sum_{l>j} g_l
    # summed from the end so that it is exactly 0, without a gradient, for the last token
    to_end = F.pad(g.flip(-1).cumsum(-1).flip(-1)[..., 1:], (0, 1))
    k_end = k * to_end.exp()[..., None]
    M = G[..., -1, None, None].exp() * torch.eye(K, dtype=q.dtype, device=q.device)
    M = M - k_end.transpose(-1, -2) @ w  # (B, H, N, K, K)
    N = k_end.transpose(-1, -2) @ u  # (B, H, N, K, V)
    return o_local, q_eff, M, N


def chunk_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule, parallel inside chunks of `chunk_size` tokens; same results as
    `naive_delta_rule` and differentiable by autograd in every input and `initial_state`.

    Args:
        q, k: [B, T, H, K]; v: [B, T, H, V]; beta: [B, T, H]; g: [B, T, H] log decay (<= 0) or
        None (no decay). scale: multiplies q, defaults to K ** -0.5.
        initial_state: [B, H, K, V] or None (zeros).
    Returns:
        o: [B, T, H, V] in the dtype of v; final state [B, H, K, V] in float32 (float64 for
        float64 inputs) when `output_final_state`, else None.
    """
    _check_shapes(q, k, v, beta, g, initial_state, chunk_size)
    B, T, H, K = q.shape
    V = v.shape[-1]
    out_dtype = v.dtype
    scale = K ** -0.5 if scale is None else scale
    dtype = torch.promote_types(q.dtype, torch.float32)
    if g is None:
        g = beta.new_zeros(B, T, H)
    # padded tokens have k = beta = g = 0: they leave the state exactly as it is
    q = q.to(dtype) * scale
    q, k, v, beta, g = (_to_chunks(x.to(dtype), chunk_size) for x in (q, k, v, beta, g))
    o_local, q_eff, M, N = _chunk_terms(q, k, v, beta, g)
    state = q.new_zeros(B, H, K, V)
    if initial_state is not None:
        state = state + initial_state.to(dtype)
    entering = []
    # unbind, not M[:, :, n]: the backward of one unbind is one stack, while the backward of each
    # index would write a zero-filled tensor the size of M
    for M_n, N_n in zip(M.unbind(2), N.unbind(2)):
        entering.append(state)
        state = M_n @ state + N_n
    if entering:
        o = o_local + q_eff @ torch.stack(entering, dim=2)  # (B, H, N, C, V)
    else:
        o = o_local
    o = o.movedim(1, 3).flatten(1, 2)[:, :T]
    return o.to(out_dtype), (state if output_final_state else None)
