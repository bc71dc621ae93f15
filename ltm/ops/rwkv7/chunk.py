"""Chunked (parallel) form of the RWKV-7 recurrence in plain PyTorch.

The per-token transition is diag(exp(w_t)) + b_t a_t^T. Within a chunk of C tokens the values
s_t = S_{t-1}^T a_t that the transition reads are found for all tokens at once from one unit
lower-triangular solve (the UT transform of the chunk's transitions), which makes the chunk's
outputs o_local + r_eff @ S and its outgoing state M @ S + N linear in the state S entering it.
All of that is batched over every chunk; only the hand-off S_next = M S + N is a Python loop.

Decay between tokens i >= j is exp(W_i - W_j) per channel with W the cumulative log decay, kept
as a (C, C, K) tensor masked to -inf before the exp: no positive exponent ever appears, so
strong decay underflows to zero instead of overflowing. The (C, C, K) tensor is why the default
chunk is small (16).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _check_shapes(r, w, k, v, a, b, initial_state, chunk_size) -> None:
    if r.dim() != 4:
        raise ValueError(f"r must be [B, T, H, K], got shape {tuple(r.shape)}")
    for name, x in (("w", w), ("k", k), ("a", a), ("b", b)):
        if x.shape != r.shape:
            raise ValueError(f"{name} must be [B, T, H, K] = {tuple(r.shape)} like r, "
                             f"got {tuple(x.shape)}")
    B, T, H, K = r.shape
    if v.dim() != 4 or v.shape[:3] != (B, T, H):
        raise ValueError(f"v must be [B, T, H, V] with B, T, H = {(B, T, H)}, got {tuple(v.shape)}")
    state_shape = (B, H, K, v.shape[-1])
    if initial_state is not None and initial_state.shape != state_shape:
        raise ValueError(f"initial_state must be [B, H, K, V] = {state_shape} or None, "
                         f"got {tuple(initial_state.shape)}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")


def _to_chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """(B, T, H, D) -> (B, H, N, C, D), zero-padded at the end to N * C tokens."""
    pad = -x.shape[1] % chunk_size
    x = F.pad(x, (0, 0, 0, 0, 0, pad))
    return x.unflatten(1, (-1, chunk_size)).movedim(3, 1)


def _pair_decay(w_incl: torch.Tensor) -> torch.Tensor:
    """(B, H, N, C_j, C_i, K): exp(W_i - W_j) for i > j, and 0 for i <= j.

    j-major, so that contracting it with a token j's vectors over the channels is a plain batched
    matmul. The differences for i <= j get -inf added before the exp: the positive ones are never
    exponentiated, and no gradient flows through the diagonal W_i - W_i, whose two halves cancel
    exactly in theory but not in float32, where they would swamp the small dw of strong decay
    (the diagonal's value, 1, is added by the caller instead).
    """
    C = w_incl.shape[-2]
    later = torch.ones(C, C, dtype=torch.bool, device=w_incl.device).triu(1)  # [j, i]: i > j
    bias = torch.zeros(C, C, 1, dtype=w_incl.dtype, device=w_incl.device)
    bias = bias.masked_fill(~later[..., None], float("-inf"))
    diff = w_incl[..., None, :, :] - w_incl[..., :, None, :]  # [j, i] = W_i - W_j
    # in place: the tensor is the size of the whole problem times C
    return diff.add_(bias).exp_()


def _read_back(decay: torch.Tensor, x: torch.Tensor, bk: torch.Tensor) -> torch.Tensor:
    """(B, H, N, C_i, C_j, 2): sum_c x_ic exp(W_i - W_j)_c y_jc for j <= i, for y = b and y = k
    (stacked in bk, (B, H, N, C, K, 2)); `decay` from `_pair_decay` holds the j < i terms."""
    earlier = ((decay * x[..., None, :, :]) @ bk).transpose(-2, -3)
    same = (x[..., None] * bk).sum(-2)  # (B, H, N, C, 2): the j == i terms, decay 1
    return earlier + torch.diag_embed(same.transpose(-1, -2), dim1=-3, dim2=-2)


def _chunk_terms(r, w, k, v, a, b):
    """Everything that does not depend on the state entering a chunk, for all chunks at once.

    Inputs are (B, H, N, C, D). With S the state entering a chunk, the chunk's outputs are
    o_local + r_eff @ S and the state leaving it is M @ S + N.
    """
    C = k.shape[-2]
    w_incl = w.cumsum(-2)  # (B, H, N, C, K) log decay up to and including token i
    w_excl = w_incl - w  # up to token i - 1: the transition reads a^T S before its own decay
    decay = _pair_decay(w_incl)
    bk = torch.stack([b, k], dim=-1)  # (B, H, N, C, K, 2)
    r_b, r_k = _read_back(decay, r, bk).unbind(-1)  # (B, H, N, C, C) each
    # token i reads a_i^T S_{i-1}, decayed up to W_{i-1}: the rows of token i - 1, shifted down
    a_next = F.pad(a[..., 1:, :], (0, 0, 0, 1))
    a_b, a_k = F.pad(_read_back(decay, a_next, bk)[..., :-1, :, :], (0, 0, 0, 0, 1, 0)).unbind(-1)
    # s_i - sum_{j<i} (a_i . decay_ij . b_j) s_j
    #     = sum_{j<i} (a_i . decay_ij . k_j) v_j + (exp(W_{i-1}) a_i)^T S
    eye = torch.eye(C, dtype=r.dtype, device=r.device)
    rhs = torch.cat([a_k @ v, a * w_excl.exp()], dim=-1)
    xy = torch.linalg.solve_triangular(eye - a_b, rhs, upper=False, unitriangular=True)
    x, y = xy[..., :v.shape[-1]], xy[..., v.shape[-1]:]  # s = x + y @ S
    o_local = r_b @ x + r_k @ v
    r_eff = r * w_incl.exp() + r_b @ y
    # b_j and k_j decayed to the end of the chunk by sum_{l>j} w_l, summed from the end so that
    # it is exactly 0, without a gradient, for the last token
    to_end = F.pad(w.flip(-2).cumsum(-2).flip(-2)[..., 1:, :], (0, 0, 0, 1)).exp()
    b_end, k_end = (b * to_end).transpose(-1, -2), (k * to_end).transpose(-1, -2)
    M = torch.diag_embed(w_incl[..., -1, :].exp()) + b_end @ y  # (B, H, N, K, K)
    N = b_end @ x + k_end @ v  # (B, H, N, K, V)
    return o_local, r_eff, M, N


def chunk_rwkv7(
    r: torch.Tensor,
    w: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 16,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RWKV-7 time mixing, parallel inside chunks of `chunk_size` tokens; same results as
    `naive_rwkv7` and differentiable by autograd in every input and `initial_state`.

    Args:
        r, w, k, a, b: [B, T, H, K] (w is the log decay, <= 0); v: [B, T, H, V].
        initial_state: [B, H, K, V] or None (zeros).
    Returns:
        o: [B, T, H, V] in the dtype of v; final state [B, H, K, V] in float32 (float64 for
        float64 inputs) when `output_final_state`, else None.
    """
    _check_shapes(r, w, k, v, a, b, initial_state, chunk_size)
    B, T, H, K = r.shape
    V = v.shape[-1]
    out_dtype = v.dtype
    dtype = torch.promote_types(r.dtype, torch.float32)
    # padded tokens have w = k = a = b = 0: an identity transition that adds nothing
    r, w, k, v, a, b = (_to_chunks(x.to(dtype), chunk_size) for x in (r, w, k, v, a, b))
    o_local, r_eff, M, N = _chunk_terms(r, w, k, v, a, b)
    state = r.new_zeros(B, H, K, V)
    if initial_state is not None:
        state = state + initial_state.to(dtype)
    entering = []
    # unbind, not M[:, :, n]: the backward of one unbind is one stack, while the backward of each
    # index would write a zero-filled tensor the size of M
    for M_n, N_n in zip(M.unbind(2), N.unbind(2)):
        entering.append(state)
        state = M_n @ state + N_n
    if entering:
        o = o_local + r_eff @ torch.stack(entering, dim=2)  # (B, H, N, C, V)
    else:
        o = o_local
    o = o.movedim(1, 3).flatten(1, 2)[:, :T]
    return o.to(out_dtype), (state if output_final_state else None)
