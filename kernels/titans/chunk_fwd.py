"""The Titans linear memory's forward in Triton: a sequential pass over the chunks for the states,
then every chunk's outputs in parallel.

Per chunk of BT tokens entering with the memory W [K, V] and its momentum S [K, V], with the gate
products a, b, Gamma and the chunk-end factors made in PyTorch (`chunk.py`, `chunk_gates`):
    Delta = K W - V                              (each token's error at the chunk's weights)
    g     = theta * min(1, clip / (|k| |Delta|))  (the clipped step; |k_s Delta_s^T| = |k||Delta|)
    O     = a * (Q W) + b * (Q S) - (Gamma * Q K^T * g) Delta
    W'    = a_end W + b_end S - K^T ((gamma_last * g) * Delta)
    S'    = e_end S - K^T ((p_last * g) * Delta)
`_titans_states_kernel` (one program per batch and head) walks the chunks with W and S in
registers: per chunk one product for Delta and two for the hand-off, the whole of the sequential
work; it stores each chunk's entering (W, S) and g. `_titans_output_kernel` (one program per chunk,
batch and head) computes O from them. Token-indexed buffers are [B, H, NT * BT, ...] (T padded).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ltm.kernels.common import dot


@triton.jit
def _load_tokens(ptr, i_b, i_h, t, mask_t, cols, mask_c, T, H: tl.constexpr, D: tl.constexpr):
    """A [BT, BD] tile of a [B, T, H, D] tensor (zeros outside T and D)."""
    offs = ((i_b * T + t) * H + i_h)[:, None] * D + cols[None, :]
    return tl.load(ptr + offs, mask=mask_t[:, None] & mask_c[None, :], other=0.0).to(tl.float32)


@triton.jit
def _chunk_program(w_states, s_states, T, NT, H: tl.constexpr, K: tl.constexpr,
                   V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """The chunk-parallel kernels' common start, one program per (chunk, batch x head): the
    program's indices, the column and token ranges with their masks, and the chunk's entering
    memory W and momentum S [BK, BV] with the offsets and mask that address them."""
    c, i_bh = tl.program_id(0), tl.program_id(1)
    rk, rv, rt = tl.arange(0, BK), tl.arange(0, BV), tl.arange(0, BT)
    mk, mv = rk < K, rv < V
    state_offs = (i_bh * NT + c) * K * V + rk[:, None] * V + rv[None, :]
    state_mask = mk[:, None] & mv[None, :]
    W = tl.load(w_states + state_offs, mask=state_mask, other=0.0)
    S = tl.load(s_states + state_offs, mask=state_mask, other=0.0)
    t = c * BT + rt
    return (c, i_bh, i_bh // H, i_bh % H, rk, rv, rt, mk, mv, t, t < T, state_offs, state_mask,
            W, S)


@triton.jit
def _clipped_step(kt, delta, th, CLIP, USE_CLIP: tl.constexpr):
    """Each token's clip factor and clipped step g = theta * clip, [BT] each."""
    if USE_CLIP:
        norm_sq = tl.sum(kt * kt, 1) * tl.sum(delta * delta, 1)
        clip = CLIP / tl.sqrt(tl.maximum(norm_sq, CLIP * CLIP))
    else:
        clip = tl.full(th.shape, 1.0, tl.float32)
    return clip, th * clip


@triton.jit
def _state_inputs(c, i_bh, i_b, i_h, k, v, theta, ends, w_last, p_last, rk, rv, rt, mk, mv, T,
                  NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr):
    """What the state pass reads of chunk c: none of it depends on the states, so the kernel
    loads a chunk's inputs one chunk ahead, while it multiplies the chunk before."""
    t = c * BT + rt
    mt = t < T
    kt = _load_tokens(k, i_b, i_h, t, mt, rk, mk, T, H, K)  # (BT, BK)
    vt = _load_tokens(v, i_b, i_h, t, mt, rv, mv, T, H, V)  # (BT, BV)
    th = tl.load(theta + (i_b * T + t) * H + i_h, mask=mt, other=0.0).to(tl.float32)
    rows = (i_bh * NT + c) * BT + rt
    e_offs = (i_bh * NT + c) * 3
    return (kt, vt, th, tl.load(w_last + rows), tl.load(p_last + rows), tl.load(ends + e_offs),
            tl.load(ends + e_offs + 1), tl.load(ends + e_offs + 2))


@triton.jit
def _titans_states_kernel(k, v, theta, ends, w_last, p_last, w0, s0, w_states, s_states, g_out,
                          wt, st, T, NT, CLIP, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                          BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                          USE_CLIP: tl.constexpr, STORE_FINAL: tl.constexpr,
                          PRECISION: tl.constexpr):
    i_bh = tl.program_id(0)
    i_b, i_h = i_bh // H, i_bh % H
    rk, rv, rt = tl.arange(0, BK), tl.arange(0, BV), tl.arange(0, BT)
    mk, mv = rk < K, rv < V
    state_offs = rk[:, None] * V + rv[None, :]
    state_mask = mk[:, None] & mv[None, :]
    W = tl.load(w0 + i_bh * K * V + state_offs, mask=state_mask, other=0.0)
    S = tl.load(s0 + i_bh * K * V + state_offs, mask=state_mask, other=0.0)
    kt, vt, th, wl, pl, a_end, b_end, e_end = _state_inputs(
        0, i_bh, i_b, i_h, k, v, theta, ends, w_last, p_last, rk, rv, rt, mk, mv, T, NT, H, K, V,
        BT)
    for c in range(NT):
        # the next chunk's inputs first (the last chunk's again after it): their loads overlap
        # this chunk's products
        kt_n, vt_n, th_n, wl_n, pl_n, a_n, b_n, e_n = _state_inputs(
            tl.minimum(c + 1, NT - 1), i_bh, i_b, i_h, k, v, theta, ends, w_last, p_last, rk, rv,
            rt, mk, mv, T, NT, H, K, V, BT)
        tl.store(w_states + (i_bh * NT + c) * K * V + state_offs, W, mask=state_mask)
        tl.store(s_states + (i_bh * NT + c) * K * V + state_offs, S, mask=state_mask)
        delta = dot(kt, W, PRECISION) - vt  # (BT, BV)
        _, g = _clipped_step(kt, delta, th, CLIP, USE_CLIP)
        tl.store(g_out + (i_bh * NT + c) * BT + rt, g)
        kt_t = tl.trans(kt)
        W_next = a_end * W + b_end * S - dot(kt_t, (wl * g)[:, None] * delta, PRECISION)
        S = e_end * S - dot(kt_t, (pl * g)[:, None] * delta, PRECISION)
        W = W_next
        kt, vt, th, wl, pl, a_end, b_end, e_end = kt_n, vt_n, th_n, wl_n, pl_n, a_n, b_n, e_n
    if STORE_FINAL:
        tl.store(wt + i_bh * K * V + state_offs, W, mask=state_mask)
        tl.store(st + i_bh * K * V + state_offs, S, mask=state_mask)


@triton.jit
def _titans_output_kernel(q, k, v, a, b, gamma, w_states, s_states, g_in, o, T, NT,
                          H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                          BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr):
    c, i_bh, i_b, i_h, rk, rv, rt, mk, mv, t, mt, state_offs, state_mask, W, S = _chunk_program(
        w_states, s_states, T, NT, H, K, V, BT, BK, BV)
    qt = _load_tokens(q, i_b, i_h, t, mt, rk, mk, T, H, K)
    kt = _load_tokens(k, i_b, i_h, t, mt, rk, mk, T, H, K)
    vt = _load_tokens(v, i_b, i_h, t, mt, rv, mv, T, H, V)
    g_base = (i_bh * NT + c) * BT
    g = tl.load(g_in + g_base + rt)
    gam = tl.load(gamma + (g_base + rt)[:, None] * BT + rt[None, :])  # (BT, BT), lower
    delta = dot(kt, W, PRECISION) - vt
    scores = gam * dot(qt, tl.trans(kt), PRECISION) * g[None, :]
    ot = (tl.load(a + g_base + rt)[:, None] * dot(qt, W, PRECISION)
          + tl.load(b + g_base + rt)[:, None] * dot(qt, S, PRECISION) - dot(scores, delta, PRECISION))
    o_offs = ((i_b * T + t) * H + i_h)[:, None] * V + rv[None, :]
    tl.store(o + o_offs, ot.to(o.dtype.element_ty), mask=mt[:, None] & mv[None, :])
