"""Forward kernels of the chunked RWKV-7 recurrence, and the tile helpers the backward shares;
`chunk.py` launches them and gives the maths.

`_prep_fwd_kernel` (chunk-parallel): the pair matrices, L^-1, X, Y and what the backward reuses.
`_fwd_state_kernel` (sequential over chunks): the entering states and s. `_output_kernel`
(chunk-parallel): o.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ltm.kernels.common import (dot, invert_unit_lower, invert_unit_lower_by_squaring, load_rows, load_tile,
                                rounded, seq_tile, state_tile, store_rows, store_tile)


@triton.jit
def _row(x, idx, j):
    """Row j of a 2-D tile, as a 1-D tensor along its columns."""
    return tl.sum(tl.where(idx[:, None] == j, x, 0.), axis=0)


@triton.jit
def _token_row(x, i_b, i_h, T, H, D: tl.constexpr, t, BD: tl.constexpr):
    """Row t of head i_h of a [B, T, H, D] tensor as a (BD,) float32 vector (zeros past T and D).
    The column loops read their partner token's rows from memory (cached) rather than pick them
    out of the tiles, which costs a reduction across warps per row."""
    o_d = tl.arange(0, BD)
    # one comparison, not (o_d < D) & (t < T): the interpreter's & of a vector and a scalar
    # condition is int32, which Triton 3.9's interpreter refuses as a mask
    row = tl.load(x + ((i_b * T + t) * H + i_h) * D + o_d, mask=o_d < tl.where(t < T, D, 0), other=0.)
    return row.to(tl.float32)


@triton.jit
def _col(x, idx, j):
    """Column j of a 2-D tile, as a 1-D tensor along its rows."""
    return tl.sum(tl.where(idx[None, :] == j, x, 0.), axis=1)


@triton.jit
def _cc_ptrs(x, i_bh, i_t, NT, C: tl.constexpr):
    """Pointers to the (C, C) matrix of chunk i_t of head i_bh in a [B * H, NT, C, C] buffer."""
    idx = tl.arange(0, C)
    return x + (i_bh * NT + i_t) * C * C + idx[:, None] * C + idx[None, :]


@triton.jit
def _decays(w, C: tl.constexpr):
    """In-chunk cumulative log decays of a (C, BK) tile of w: inclusive W, exclusive E, and the
    chunk's last row of W. Rows past the sequence end hold w = 0, so W_last is the last token's."""
    W = tl.cumsum(w, axis=0)
    return W, W - w, _row(W, tl.arange(0, C), C - 1)


@triton.jit
def _pair_matrices(b_r, b_a, W, E, k, b, i_b, i_h, T, H, K: tl.constexpr, t0, C: tl.constexpr,
                   BK: tl.constexpr):
    """A_ab, A_ak (strictly lower) and A_rb, A_rk (lower), one column j at a time: every factor is
    exp of a sum of log decays over tokens j+1 .. i (or .. i-1), so none can overflow."""
    idx = tl.arange(0, C)
    a_ab = tl.zeros([C, C], dtype=tl.float32)
    a_ak = tl.zeros([C, C], dtype=tl.float32)
    a_rb = tl.zeros([C, C], dtype=tl.float32)
    a_rk = tl.zeros([C, C], dtype=tl.float32)
    for j in tl.static_range(C):
        # W_j exactly as in the tile: exp(W_i - W_j) must be 1 on the diagonal
        W_j = _row(W, idx, j)
        b_j = _token_row(b, i_b, i_h, T, H, K, t0 + j, BK)
        k_j = _token_row(k, i_b, i_h, T, H, K, t0 + j, BK)
        strict = (idx > j)[:, None]
        causal = (idx >= j)[:, None]
        aF = tl.where(strict, b_a * tl.exp(tl.where(strict, E - W_j[None, :], 0.)), 0.)
        rD = tl.where(causal, b_r * tl.exp(tl.where(causal, W - W_j[None, :], 0.)), 0.)
        at_j = idx[None, :] == j
        a_ab = tl.where(at_j, tl.sum(aF * b_j[None, :], axis=1)[:, None], a_ab)
        a_ak = tl.where(at_j, tl.sum(aF * k_j[None, :], axis=1)[:, None], a_ak)
        a_rb = tl.where(at_j, tl.sum(rD * b_j[None, :], axis=1)[:, None], a_rb)
        a_rk = tl.where(at_j, tl.sum(rD * k_j[None, :], axis=1)[:, None], a_rk)
    return a_ab, a_ak, a_rb, a_rk


@triton.jit
def _pair_matrices_fast(b_r, b_a, b_k, b_b, W, E, C: tl.constexpr, PRECISION: tl.constexpr):
    """`_pair_matrices` as four products, for chunks whose decay span is below FAST_SPAN:
    exp(W_i - W_j) = exp(W_i) exp(-W_j) with neither factor beyond exp(FAST_SPAN)."""
    idx = tl.arange(0, C)
    e_neg = tl.exp(-W)
    b_hat, k_hat = b_b * e_neg, b_k * e_neg
    a_t = b_a * tl.exp(E)
    r_t = b_r * tl.exp(W)
    strict = idx[:, None] > idx[None, :]
    causal = idx[:, None] >= idx[None, :]
    a_ab = tl.where(strict, dot(a_t, tl.trans(b_hat), PRECISION), 0.)
    a_ak = tl.where(strict, dot(a_t, tl.trans(k_hat), PRECISION), 0.)
    a_rb = tl.where(causal, dot(r_t, tl.trans(b_hat), PRECISION), 0.)
    a_rk = tl.where(causal, dot(r_t, tl.trans(k_hat), PRECISION), 0.)
    return a_ab, a_ak, a_rb, a_rk


@triton.jit
def _prep_fwd_kernel(r, w, k, v, a, b, x, y, bbar, kbar, ybar, rt, at, gam, arl, arb, ark, aak, T, H,
                     K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                     BV: tl.constexpr, PRECISION: tl.constexpr, INV_PRECISION: tl.constexpr,
                     FAST_SPAN: tl.constexpr):
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    NT = tl.cdiv(T, C)
    t0 = i_t * C
    b_r = load_rows(r, i_b, i_h, T, H, K, t0, C, BK)
    b_w = load_rows(w, i_b, i_h, T, H, K, t0, C, BK)
    b_k = load_rows(k, i_b, i_h, T, H, K, t0, C, BK)
    b_a = load_rows(a, i_b, i_h, T, H, K, t0, C, BK)
    b_b = load_rows(b, i_b, i_h, T, H, K, t0, C, BK)
    W, E, W_last = _decays(b_w, C)
    if tl.min(W_last, axis=0) > -FAST_SPAN:
        # in INV_PRECISION (tf32 also when the tiles are bf16), like the exact loop's float32
        a_ab, a_ak, a_rb, a_rk = _pair_matrices_fast(b_r, b_a, b_k, b_b, W, E, C, INV_PRECISION)
    else:
        a_ab, a_ak, a_rb, a_rk = _pair_matrices(b_r, b_a, W, E, k, b, i_b, i_h, T, H, K, t0, C, BK)
    # L^-1 in INV_PRECISION (tf32 also when the tiles are bf16); its products take PRECISION
    if C == 16:
        b_linv = invert_unit_lower_by_squaring(-a_ab, C, INV_PRECISION)
    else:
        b_linv = invert_unit_lower(-a_ab, C)
    b_at = b_a * tl.exp(E)
    store_rows(y, dot(b_linv, b_at, PRECISION), i_b, i_h, T, H, K, t0, C, BK)
    # the backward's state kernel takes r exp(W), a exp(E) and exp(W_last) ready-made, so that its
    # serial loop holds products and loads only
    store_rows(rt, b_r * tl.exp(W), i_b, i_h, T, H, K, t0, C, BK)
    store_rows(at, b_at, i_b, i_h, T, H, K, t0, C, BK)
    o_k = tl.arange(0, BK)
    tl.store(gam + (i_bh * NT + i_t) * K + o_k, tl.exp(W_last), mask=o_k < K)
    b_v = load_rows(v, i_b, i_h, T, H, V, t0, C, BV)
    b_x = dot(dot(b_linv, a_ak, INV_PRECISION), b_v, PRECISION)
    store_rows(x, b_x, i_b, i_h, T, H, V, t0, C, BV)
    to_end = tl.exp(W_last[None, :] - W)
    b_bbar = b_b * to_end
    store_rows(bbar, b_bbar, i_b, i_h, T, H, K, t0, C, BK)
    store_rows(kbar, b_k * to_end, i_b, i_h, T, H, K, t0, C, BK)
    # for the backward's P = (A_rb L^-1)^T dO + (L^-T Bbar) Gc: one product on its serial path
    store_rows(ybar, dot(tl.trans(b_linv), b_bbar, PRECISION), i_b, i_h, T, H, K, t0, C, BK)
    mid = arl.dtype.element_ty
    tl.store(_cc_ptrs(arl, i_bh, i_t, NT, C), rounded(dot(a_rb, b_linv, INV_PRECISION), mid))
    tl.store(_cc_ptrs(arb, i_bh, i_t, NT, C), rounded(a_rb, mid))
    tl.store(_cc_ptrs(ark, i_bh, i_t, NT, C), rounded(a_rk, mid))
    tl.store(_cc_ptrs(aak, i_bh, i_t, NT, C), rounded(a_ak, mid))


@triton.jit
def _fwd_state_kernel(gam, v, x, y, bbar, kbar, h, s, h0, ht, T, H, K: tl.constexpr,
                      V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                      USE_H0: tl.constexpr, STORE_HT: tl.constexpr, PRECISION: tl.constexpr):
    # the sequential part only: the state entering each chunk and s = X + Y S0
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    NT = tl.cdiv(T, C)
    v0 = i_v * BV
    b_S = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        p_h0 = state_tile(h0, i_bh, K, V, v0, BK, BV)
        b_S += load_tile(p_h0).to(tl.float32)
    for i_t in range(NT):
        t0 = i_t * C
        p_h = state_tile(h, i_bh * NT + i_t, K, V, v0, BK, BV)
        store_tile(p_h, b_S)
        # (BK,): exp(W_last), the whole chunk's decay
        o_k = tl.arange(0, BK)
        b_gam = tl.load(gam + (i_bh * NT + i_t) * K + o_k, mask=o_k < K, other=0.)
        p_x = seq_tile(x, i_b, i_h, T, H, V, t0, v0, C, BV)
        p_v = seq_tile(v, i_b, i_h, T, H, V, t0, v0, C, BV)
        p_s = seq_tile(s, i_b, i_h, T, H, V, t0, v0, C, BV)
        b_y = load_rows(y, i_b, i_h, T, H, K, t0, C, BK)
        b_s = load_tile(p_x).to(tl.float32) + dot(b_y, b_S, PRECISION)
        store_tile(p_s, b_s)
        b_bbar = load_rows(bbar, i_b, i_h, T, H, K, t0, C, BK)
        b_kbar = load_rows(kbar, i_b, i_h, T, H, K, t0, C, BK)
        b_v = load_tile(p_v).to(tl.float32)
        b_S = (b_S * b_gam[:, None] + dot(tl.trans(b_bbar), b_s, PRECISION)
               + dot(tl.trans(b_kbar), b_v, PRECISION))
    if STORE_HT:
        p_ht = state_tile(ht, i_bh, K, V, v0, BK, BV)
        store_tile(p_ht, b_S)


@triton.jit
def _output_kernel(r, w, v, h, s, arb, ark, o, T, H, K: tl.constexpr, V: tl.constexpr,
                   C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr):
    # o = (r exp(W)) S0 + A_rb s + A_rk V, every chunk in parallel
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    NT = tl.cdiv(T, C)
    t0, v0 = i_t * C, i_v * BV
    b_r = load_rows(r, i_b, i_h, T, H, K, t0, C, BK)
    W = tl.cumsum(load_rows(w, i_b, i_h, T, H, K, t0, C, BK), axis=0)
    p_h = state_tile(h, i_bh * NT + i_t, K, V, v0, BK, BV)
    tv = (i_b * T * H + i_h) * V
    p_v = seq_tile(v, i_b, i_h, T, H, V, t0, v0, C, BV)
    p_s = seq_tile(s, i_b, i_h, T, H, V, t0, v0, C, BV)
    p_o = seq_tile(o, i_b, i_h, T, H, V, t0, v0, C, BV)
    b_o = dot(b_r * tl.exp(W), load_tile(p_h), PRECISION)
    b_o += dot(tl.load(_cc_ptrs(arb, i_bh, i_t, NT, C)), load_tile(p_s), PRECISION)
    b_o += dot(tl.load(_cc_ptrs(ark, i_bh, i_t, NT, C)), load_tile(p_v), PRECISION)
    store_tile(p_o, b_o)
