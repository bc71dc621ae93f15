"""Chunked form of the dual-state (fast/slow) delta rule in plain PyTorch, reading q, k, v once.

The stacked path runs `ltm.ops.delta_rule.chunk_delta_rule` on q, k, v concatenated twice along
the heads. Here the two states are a group axis of size 2 that only beta and g carry: the chunks
of q, k, v, the key-key products k k^T (the UT transform's matrix before decay and beta) and the
query-key products q k^T are computed once and broadcast over both states; the decays of both
(cumulative sums, decay masks, exponentials) are computed in one stacked tensor. The algebra per
state is that of `ltm.ops.delta_rule.chunk` (see there): d = u - w S, o = o_local + q_eff S,
S_next = M S + N. Sequences start at a chunk boundary (the entry point aligns a continuation).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ltm.ops.dual_delta_rule.step import init_dual_state


def _chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """(B, T, H, ...) -> (B, H, N, C, ...), zero-padded to N * C tokens."""
    pad = -x.shape[1] % chunk_size
    x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad))
    return x.unflatten(1, (-1, chunk_size)).movedim(3, 1)


def _group_chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """beta or g (B, T, 2H) -> (B, 2, H, N, C): the fast / slow group axis first."""
    x = _chunks(x.unflatten(2, (2, -1)), chunk_size)  # (B, 2, N, C, H)
    return x.permute(0, 1, 4, 2, 3)


def _terms(q, k, v, beta, g, fast_read: str):
    """Everything that does not depend on the state entering a chunk. q, k, v (B, 1, H, N, C, D)
    shared by both groups, beta, g (B, 2, H, N, C). o_local is None for a group that is not
    read inside its chunk."""
    C, K = k.shape[-2], k.shape[-1]
    G = g.cumsum(-1)
    below = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1)
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    # the diagonal set to 1, not exp(0): see ltm.ops.delta_rule.chunk
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~below, float("-inf")).exp() + eye
    kk = k @ k.transpose(-1, -2)  # (B, 1, H, N, C, C): once for both states
    lower = eye + (beta[..., None] * decay * kk).tril(-1)
    # (B, 2, H, N, C, V + K): v and k broadcast over the groups
    rhs = torch.cat([beta[..., None] * v, (beta * G.exp())[..., None] * k], dim=-1)
    uw = torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
    u, w = uw[..., :v.shape[-1]], uw[..., v.shape[-1]:]
    qk = q @ k.transpose(-1, -2)  # once for both states
    q_decayed = q * G.exp()[..., None]
    if fast_read == "chunk":  # the fast group (0) is read only at chunk boundaries
        scores = qk * decay[:, 1:]
        o_local = scores @ u[:, 1:]
        q_eff = torch.cat([q_decayed[:, :1], q_decayed[:, 1:] - scores @ w[:, 1:]], dim=1)
    else:
        scores = qk * decay
        o_local, q_eff = scores @ u, q_decayed - scores @ w
    to_end = F.pad(g.flip(-1).cumsum(-1).flip(-1)[..., 1:], (0, 1))
    k_end = k * to_end.exp()[..., None]
    M = G[..., -1, None, None].exp() * torch.eye(K, dtype=q.dtype, device=q.device)
    M = M - k_end.transpose(-1, -2) @ w  # (B, 2, H, N, K, K)
    N = k_end.transpose(-1, -2) @ u  # (B, 2, H, N, K, V)
    return G, u, w, o_local, q_eff, M, N


def chunk_dual_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    *,
    fast_read: str = "token",
    slow_threshold: float | None = None,
    chunk_size: int = 64,
    scale: float | None = None,
    state: dict | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, dict | None]:
    """The function of `naive_dual_delta_rule`, parallel inside chunks; differentiable by
    autograd. q, k: [B, T, H, K]; v: [B, T, H, V]; beta, g: [B, T, 2H] (fast first); state: at a
    chunk boundary (its "pos" a multiple of chunk_size) or None. Returns o [B, T, 2H, V] in the
    dtype of v and, when `output_final_state`, the final state (see step.py), else None."""
    # float32 (float64) throughout, autocast or not: under bf16 autocast the matmuls of the state
    # hand-off would otherwise round the recurrent state to bf16 at every chunk
    with torch.autocast(q.device.type, enabled=False):
        return _chunk_dual(q, k, v, beta, g, fast_read, slow_threshold, chunk_size, scale, state,
                           output_final_state)


def _chunk_dual(q, k, v, beta, g, fast_read, slow_threshold, chunk_size, scale, state,
                output_final_state):
    B, T, H, K = q.shape
    V, C, out_dtype = v.shape[-1], chunk_size, v.dtype
    scale = K ** -0.5 if scale is None else scale
    dtype = torch.promote_types(q.dtype, torch.float32)
    if T == 0:  # nothing to do: the state as it came (zeros when None)
        if state is None:
            state = init_dual_state(B, H, K, V, fast_read=fast_read, slow_threshold=slow_threshold,
                                    device=q.device, dtype=dtype)
        return v.new_zeros(B, 0, 2 * H, V), (state if output_final_state else None)
    # padded tokens have k = beta = g = 0: they leave both states as they are
    q, k, v = (_chunks(x.to(dtype), C)[:, None] for x in (q.to(dtype) * scale, k, v))
    beta, g = (_group_chunks(x.to(dtype), C) for x in (beta, g))
    G, u, w, o_local, q_eff, M, N = _terms(q, k, v, beta, g, fast_read)
    S = q.new_zeros(B, 2, H, K, V) if state is None else state["S"].to(dtype).unflatten(1, (2, H))
    event = slow_threshold is not None
    # the slow group's reference norm of each chunk, sum_t |beta_t v_t|^2: (B, H, N)
    ref = (beta[:, 1, ..., None] * v[:, 0]).square().sum((-1, -2)) if event else None
    n_chunks, partial = M.shape[3], T % C != 0
    entering, err = [], None
    for n in range(n_chunks):
        entering.append(S)
        S_next = M[:, :, :, n] @ S + N[:, :, :, n]
        if event:
            # the slow group's applied deltas d = u - w S and their squared norm (B, H)
            d = u[:, 1, :, n] - w[:, 1, :, n] @ S[:, 1]
            err = d.square().sum((-1, -2))
            if not (partial and n == n_chunks - 1):  # the last, partial chunk stays pending
                keep = (err >= slow_threshold * ref[..., n])[..., None, None]
                S_next = torch.stack([S_next[:, 0], torch.where(keep, S_next[:, 1], S[:, 1])], 1)
        S = S_next
    o = q_eff @ torch.stack(entering, dim=3)
    if fast_read == "chunk":
        o = torch.cat([o[:, :1], o[:, 1:] + o_local], dim=1)
    else:
        o = o + o_local
    # (B, 2, H, N, C, V) -> (B, T, 2H, V)
    o = o.permute(0, 3, 4, 1, 2, 5).reshape(B, -1, 2 * H, V)[:, :T].to(out_dtype)
    if not output_final_state:
        return o, None
    return o, _final_state(state, S, entering, G, err, ref, T, C, fast_read, event, B, H)


def _final_state(state, S, entering, G, err, ref, T, C, fast_read, event, B, H) -> dict:
    """The state after the last token: "S" and, for the variants, what a continuation of a
    partial last chunk needs (read state, committed slow state, surprise sums, position)."""
    out = {"S": S.flatten(1, 2)}
    if fast_read != "chunk" and not event:
        return out
    last = entering[-1]  # the state entering the last chunk
    partial = T % C != 0
    pos = torch.full((B,), T, dtype=torch.long, device=S.device)
    out["pos"] = pos if state is None else state["pos"] + T
    if fast_read == "chunk":
        # padded tokens have g = 0: G's last entry is the decay up to the last real token
        out["R"] = last[:, 0] * G[:, 0, :, -1, -1].exp()[..., None, None] if partial else S[:, 0]
    if event:
        zeros = S.new_zeros(B, H)
        out["commit"] = last[:, 1] if partial else S[:, 1]
        out["err"] = err if partial else zeros
        out["ref"] = ref[..., -1] if partial else zeros
    return out
