"""RWKV-7 recurrence in Triton, chunked (chunk-parallel), forward and backward.

Per token t, state S of shape [K, V], w_t the log decay (<= 0), a_t^T S read before the decay:
    s_t = S_{t-1}^T a_t;  S_t = diag(exp(w_t)) S_{t-1} + b_t s_t^T + k_t v_t^T;  o_t = S_t^T r_t
Per chunk of C tokens, with W_i the inclusive in-chunk cumulative log decay (per channel),
E_i = W_i - w_i the exclusive one and S0 the state entering the chunk, the pair matrices
    A_ab[i, j] = sum_c a_i b_j exp(E_i - W_j)  (j < i),   A_ak likewise with k_j,
    A_rb[i, j] = sum_c r_i b_j exp(W_i - W_j)  (j <= i),  A_rk likewise with k_j
are products of r exp(W), a exp(E) with b exp(-W), k exp(-W) where the chunk's decay span is
below FAST_SPAN, else built column by column from exp(W_i - W_j) itself (exponents <= 0, so any
decay is exact); the backward's pair sums likewise. Then
    L = I - A_ab,  s = X + Y S0  with  X = L^-1 A_ak V,  Y = L^-1 (a exp(E)),
    o = (r exp(W)) S0 + A_rb s + A_rk V,
    S_C = exp(W_last) S0 + (b exp(W_last - W))^T s + (k exp(W_last - W))^T V.
The backward carries Gc, the gradient of the state leaving a chunk from the tokens after it:
    P = L^-T (A_rb^T dO + (b exp(W_last - W)) Gc)          (P_i = G_i^T b_i; the forward's
                                                            prep saves A_rb L^-1 and L^-T Bbar)
    Gc <- exp(W_last) Gc + (r exp(W))^T dO + (a exp(E))^T P
and per token dr = S_t do, dk = G_t v, dv = G_t^T k, db = G_t s, da = S_{t-1} p, each a state
term plus in-chunk pair sums weighted by exp(W_i - W_j). dw_t = exp(w_t) sum_v S_{t-1} G_t (per
channel) is, by the same expansion, the sum over the (source, sink) pairs that straddle token t:
sources S0, b_j s_j^T and k_j v_j^T for j < t, sinks Gc, r_i do_i^T for i >= t and a_i p_i^T for
i > t; each pair's product is a term of dr, da, dk or db already formed, so dw is gathered from
them directly. (The shorter identity dw_t = sum_{t' >= t} (r dr - b db - k dk + a_{t'+1} da_{t'+1}),
plus the final state's term, cancels heavily under strong decay: 1e-2 against 3e-3 in bf16. The
tensor-core path uses it for the in-chunk pairs only, where the decay is weak by construction.)
Kernels: `_prep_fwd_kernel` (chunk-parallel: pair matrices, L^-1, X, Y, ...), `_fwd_state_kernel`
(sequential over chunks: entering states and s), `_output_kernel` (chunk-parallel: o),
`_bwd_state_kernel` (sequential, backwards: Gc and P), `_bwd_grad_kernel` (chunk-parallel: every
input gradient; launched once per in-chunk path, each program skipping the other path's chunks).
Tested against `ltm.ops.rwkv7.naive.naive_rwkv7`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ltm.kernels.common import (block_size, check_rwkv7_inputs, dot, dot_precision,
                                intermediate_dtype, invert_unit_lower,
                                invert_unit_lower_by_squaring, load_rows, nan_buffer, rounded,
                                store_rows)

# Tokens per chunk: one 16 x 16 block per chunk keeps every in-chunk matrix one tensor-core tile.
# The kernels take it as a constexpr; 32 and 64 pass the tests under the interpreter too (L^-1 then
# by forward substitution), but their (C, K) float32 tiles spill on a GPU (untimed).
CHUNK = 16
# Chunks whose decay span, max over channels of -sum(w), is below this take the tensor-core path:
# pair matrices and pair sums as products of r exp(W), a exp(E) with b exp(-W), k exp(-W), whose
# factors stay within exp(+-FAST_SPAN) (no overflow, no underflow to subnormals). RWKV-7's own
# decays (log decay -exp(-0.5) sigmoid(.) >= -0.61 per token) always do at 16 tokens; stronger
# chunks take the exact column loops.
FAST_SPAN = 40.0


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
    row = tl.load(x + ((i_b * T + t) * H + i_h) * D + o_d, mask=(o_d < D) & (t < T), other=0.)
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
        p_h0 = tl.make_block_ptr(h0 + i_bh * K * V, (K, V), (V, 1), (0, v0), (BK, BV), (1, 0))
        b_S += tl.load(p_h0, boundary_check=(0, 1)).to(tl.float32)
    for i_t in range(NT):
        t0 = i_t * C
        p_h = tl.make_block_ptr(h + (i_bh * NT + i_t) * K * V, (K, V), (V, 1), (0, v0), (BK, BV), (1, 0))
        tl.store(p_h, rounded(b_S, p_h.dtype.element_ty), boundary_check=(0, 1))
        # (BK,): exp(W_last), the whole chunk's decay
        o_k = tl.arange(0, BK)
        b_gam = tl.load(gam + (i_bh * NT + i_t) * K + o_k, mask=o_k < K, other=0.)
        p_x = tl.make_block_ptr(x + (i_b * T * H + i_h) * V, (T, V), (H * V, 1), (t0, v0), (C, BV), (1, 0))
        p_v = tl.make_block_ptr(v + (i_b * T * H + i_h) * V, (T, V), (H * V, 1), (t0, v0), (C, BV), (1, 0))
        p_s = tl.make_block_ptr(s + (i_b * T * H + i_h) * V, (T, V), (H * V, 1), (t0, v0), (C, BV), (1, 0))
        b_y = load_rows(y, i_b, i_h, T, H, K, t0, C, BK)
        b_s = tl.load(p_x, boundary_check=(0, 1)).to(tl.float32) + dot(b_y, b_S, PRECISION)
        tl.store(p_s, rounded(b_s, p_s.dtype.element_ty), boundary_check=(0, 1))
        b_bbar = load_rows(bbar, i_b, i_h, T, H, K, t0, C, BK)
        b_kbar = load_rows(kbar, i_b, i_h, T, H, K, t0, C, BK)
        b_v = tl.load(p_v, boundary_check=(0, 1)).to(tl.float32)
        b_S = (b_S * b_gam[:, None] + dot(tl.trans(b_bbar), b_s, PRECISION)
               + dot(tl.trans(b_kbar), b_v, PRECISION))
    if STORE_HT:
        p_ht = tl.make_block_ptr(ht + i_bh * K * V, (K, V), (V, 1), (0, v0), (BK, BV), (1, 0))
        tl.store(p_ht, b_S, boundary_check=(0, 1))


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
    p_h = tl.make_block_ptr(h + (i_bh * NT + i_t) * K * V, (K, V), (V, 1), (0, v0), (BK, BV), (1, 0))
    tv = (i_b * T * H + i_h) * V
    p_v = tl.make_block_ptr(v + tv, (T, V), (H * V, 1), (t0, v0), (C, BV), (1, 0))
    p_s = tl.make_block_ptr(s + tv, (T, V), (H * V, 1), (t0, v0), (C, BV), (1, 0))
    p_o = tl.make_block_ptr(o + tv, (T, V), (H * V, 1), (t0, v0), (C, BV), (1, 0))
    b_o = dot(b_r * tl.exp(W), tl.load(p_h, boundary_check=(0, 1)), PRECISION)
    b_o += dot(tl.load(_cc_ptrs(arb, i_bh, i_t, NT, C)), tl.load(p_s, boundary_check=(0, 1)), PRECISION)
    b_o += dot(tl.load(_cc_ptrs(ark, i_bh, i_t, NT, C)), tl.load(p_v, boundary_check=(0, 1)), PRECISION)
    tl.store(p_o, rounded(b_o, p_o.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def _bwd_state_kernel(rt, at, gam, ybar, do, arl, dh, p, dht, dh0, T, H, K: tl.constexpr,
                      V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                      USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr, PRECISION: tl.constexpr):
    # backwards over the chunks, carrying Gc (the gradient of the state leaving the chunk from
    # the tokens after it): P = (A_rb L^-1)^T dO + Ybar Gc with Ybar = L^-T Bbar, then
    # Gc <- exp(W_last) Gc + R~^T dO + A~^T P
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    NT = tl.cdiv(T, C)
    v0 = i_v * BV
    b_G = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        p_dht = tl.make_block_ptr(dht + i_bh * K * V, (K, V), (V, 1), (0, v0), (BK, BV), (1, 0))
        b_G += tl.load(p_dht, boundary_check=(0, 1)).to(tl.float32)
    for j in range(NT):
        i_t = NT - 1 - j
        t0 = i_t * C
        p_dh = tl.make_block_ptr(dh + (i_bh * NT + i_t) * K * V, (K, V), (V, 1), (0, v0), (BK, BV), (1, 0))
        tl.store(p_dh, rounded(b_G, p_dh.dtype.element_ty), boundary_check=(0, 1))
        tv = (i_b * T * H + i_h) * V
        p_do = tl.make_block_ptr(do + tv, (T, V), (H * V, 1), (t0, v0), (C, BV), (1, 0))
        p_p = tl.make_block_ptr(p + tv, (T, V), (H * V, 1), (t0, v0), (C, BV), (1, 0))
        b_do = tl.load(p_do, boundary_check=(0, 1)).to(tl.float32)
        b_arl = tl.load(_cc_ptrs(arl, i_bh, i_t, NT, C))
        b_ybar = load_rows(ybar, i_b, i_h, T, H, K, t0, C, BK)
        b_p = dot(tl.trans(b_arl), b_do, PRECISION) + dot(b_ybar, b_G, PRECISION)
        tl.store(p_p, rounded(b_p, p_p.dtype.element_ty), boundary_check=(0, 1))
        o_k = tl.arange(0, BK)
        b_gam = tl.load(gam + (i_bh * NT + i_t) * K + o_k, mask=o_k < K, other=0.)
        b_rt = load_rows(rt, i_b, i_h, T, H, K, t0, C, BK)
        b_at = load_rows(at, i_b, i_h, T, H, K, t0, C, BK)
        b_G = (b_G * b_gam[:, None] + dot(tl.trans(b_rt), b_do, PRECISION)
               + dot(tl.trans(b_at), b_p, PRECISION))
    if STORE_DH0:
        p_dh0 = tl.make_block_ptr(dh0 + i_bh * K * V, (K, V), (V, 1), (0, v0), (BK, BV), (1, 0))
        tl.store(p_dh0, b_G, boundary_check=(0, 1))


@triton.jit
def _bwd_grad_kernel(r, w, k, v, a, b, h, s, dh, p, do, ark, aak, dr, dw, dk, dv, da, db,
                     T, H, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                     BV: tl.constexpr, PRECISION: tl.constexpr, PAIR_PRECISION: tl.constexpr,
                     FAST_SPAN: tl.constexpr, EXACT: tl.constexpr):
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    NT = tl.cdiv(T, C)
    t0 = i_t * C
    W, E, W_last = _decays(load_rows(w, i_b, i_h, T, H, K, t0, C, BK), C)
    # each chunk is taken by the launch for its path (`_rwkv7_bwd` launches both): compiled
    # together, the column loop and the products spilled 2 KB per thread (ptxas, sm_90)
    if (tl.min(W_last, axis=0) <= -FAST_SPAN) == EXACT:
        to_end = tl.exp(W_last[None, :] - W)
        b_kbar = load_rows(k, i_b, i_h, T, H, K, t0, C, BK) * to_end
        b_ark = tl.load(_cc_ptrs(ark, i_bh, i_t, NT, C))
        b_aak = tl.load(_cc_ptrs(aak, i_bh, i_t, NT, C))
        # state terms: dO S0^T, P S0^T, V Gc^T, s Gc^T, summed over the value blocks
        dr_s = tl.zeros([C, BK], dtype=tl.float32)
        da_s = tl.zeros([C, BK], dtype=tl.float32)
        dk_s = tl.zeros([C, BK], dtype=tl.float32)
        db_s = tl.zeros([C, BK], dtype=tl.float32)
        # (BK,): sum_v S0 Gc, for dw
        s0_gc = tl.zeros([BK], dtype=tl.float32)
        # (C, C): dO s^T, dO V^T, P s^T, P V^T, the weights of the in-chunk pair sums
        q_ds = tl.zeros([C, C], dtype=tl.float32)
        q_dv = tl.zeros([C, C], dtype=tl.float32)
        q_ps = tl.zeros([C, C], dtype=tl.float32)
        q_pv = tl.zeros([C, C], dtype=tl.float32)
        for i_v in range(tl.cdiv(V, BV)):
            v0 = i_v * BV
            p_h = tl.make_block_ptr(h + (i_bh * NT + i_t) * K * V, (K, V), (V, 1), (0, v0), (BK, BV), (1, 0))
            p_dh = tl.make_block_ptr(dh + (i_bh * NT + i_t) * K * V, (K, V), (V, 1), (0, v0), (BK, BV), (1, 0))
            tv = (i_b * T * H + i_h) * V
            p_v = tl.make_block_ptr(v + tv, (T, V), (H * V, 1), (t0, v0), (C, BV), (1, 0))
            p_s = tl.make_block_ptr(s + tv, (T, V), (H * V, 1), (t0, v0), (C, BV), (1, 0))
            p_p = tl.make_block_ptr(p + tv, (T, V), (H * V, 1), (t0, v0), (C, BV), (1, 0))
            p_do = tl.make_block_ptr(do + tv, (T, V), (H * V, 1), (t0, v0), (C, BV), (1, 0))
            p_dv = tl.make_block_ptr(dv + tv, (T, V), (H * V, 1), (t0, v0), (C, BV), (1, 0))
            b_h = tl.load(p_h, boundary_check=(0, 1))
            b_dh = tl.load(p_dh, boundary_check=(0, 1))
            b_v = tl.load(p_v, boundary_check=(0, 1)).to(tl.float32)
            b_s = tl.load(p_s, boundary_check=(0, 1))
            b_p = tl.load(p_p, boundary_check=(0, 1))
            b_do = tl.load(p_do, boundary_check=(0, 1)).to(tl.float32)
            dr_s += dot(b_do, tl.trans(b_h), PRECISION)
            da_s += dot(b_p, tl.trans(b_h), PRECISION)
            dk_s += dot(b_v, tl.trans(b_dh), PRECISION)
            db_s += dot(b_s, tl.trans(b_dh), PRECISION)
            s0_gc += tl.sum(b_h.to(tl.float32) * b_dh.to(tl.float32), axis=1)
            q_ds += dot(b_do, tl.trans(b_s), PRECISION)
            q_dv += dot(b_do, tl.trans(b_v), PRECISION)
            q_ps += dot(b_p, tl.trans(b_s), PRECISION)
            q_pv += dot(b_p, tl.trans(b_v), PRECISION)
            # dv = G^T k = Kbar Gc + A_rk^T dO + A_ak^T P
            b_dv = (dot(b_kbar, b_dh, PRECISION) + dot(tl.trans(b_ark), b_do, PRECISION)
                    + dot(tl.trans(b_aak), b_p, PRECISION))
            tl.store(p_dv, rounded(b_dv, p_dv.dtype.element_ty), boundary_check=(0, 1))
        dr_s *= tl.exp(W)
        da_s *= tl.exp(E)
        dk_s *= to_end
        db_s *= to_end
        # the (C, K) inputs are loaded only now, to keep fewer tiles alive through the loop above
        b_r = load_rows(r, i_b, i_h, T, H, K, t0, C, BK)
        b_a = load_rows(a, i_b, i_h, T, H, K, t0, C, BK)
        # dw_t = exp(w_t) sum_v S_{t-1} G_t gathers every (source x, sink y) pair with x < t <= y.
        # Here the pairs with Gc as sink (all t; sources S0, b_j s_j, k_j v_j for j < t); the pair
        # functions add those with S0 or an in-chunk token as source and an in-chunk token as sink
        x_bk = (load_rows(b, i_b, i_h, T, H, K, t0, C, BK) * db_s
                + load_rows(k, i_b, i_h, T, H, K, t0, C, BK) * dk_s)
        b_dw = tl.exp(W_last) * s0_gc[None, :] + tl.cumsum(x_bk, axis=0) - x_bk
        if not EXACT:
            b_dr, b_da, b_dk, b_db, b_dw = _pair_grads_fast(dr_s, da_s, dk_s, db_s, b_dw, b_r, b_a, W, E,
                                                            q_ds, q_dv, q_ps, q_pv, k, b, i_b, i_h, T, H,
                                                            K, t0, C, BK, PAIR_PRECISION)
        else:
            b_dr, b_da, b_dk, b_db, b_dw = _pair_grads(dr_s, da_s, dk_s, db_s, b_dw, b_r, b_a, W, E,
                                                       q_ds, q_dv, q_ps, q_pv, r, w, k, a, b,
                                                       i_b, i_h, T, H, K, t0, C, BK)
        store_rows(dr, b_dr, i_b, i_h, T, H, K, t0, C, BK)
        store_rows(dk, b_dk, i_b, i_h, T, H, K, t0, C, BK)
        store_rows(da, b_da, i_b, i_h, T, H, K, t0, C, BK)
        store_rows(db, b_db, i_b, i_h, T, H, K, t0, C, BK)
        store_rows(dw, b_dw, i_b, i_h, T, H, K, t0, C, BK)


@triton.jit
def _pair_grads(b_dr, b_da, b_dk, b_db, b_dw, b_r, b_a, W, E, q_ds, q_dv, q_ps, q_pv, r, w, k, a,
                b, i_b, i_h, T, H, K: tl.constexpr, t0, C: tl.constexpr, BK: tl.constexpr):
    """Adds the in-chunk pair sums to dr, da, dk, db (which hold their state terms) and to dw,
    one partner token j at a time."""
    idx = tl.arange(0, C)
    # dw_0: the pairs with S0 as source (the loop below fills the later rows)
    first = (tl.sum(b_r * b_dr, axis=0)
             + tl.sum(tl.where((idx > 0)[:, None], b_a * b_da, 0.), axis=0))
    b_dw += tl.where((idx == 0)[:, None], first[None, :], 0.)
    for j in tl.static_range(C):
        # W_j exactly as in the tile (exp(W_i - W_j) must be 1 on the diagonal), E_j likewise
        W_j = _row(W, idx, j)
        E_j = W_j - _token_row(w, i_b, i_h, T, H, K, t0 + j, BK)
        r_j = _token_row(r, i_b, i_h, T, H, K, t0 + j, BK)
        k_j = _token_row(k, i_b, i_h, T, H, K, t0 + j, BK)
        a_j = _token_row(a, i_b, i_h, T, H, K, t0 + j, BK)
        b_j = _token_row(b, i_b, i_h, T, H, K, t0 + j, BK)
        lower = (idx >= j)[:, None]
        upper = (idx <= j)[:, None]
        strict_lower = (idx > j)[:, None]
        strict_upper = (idx < j)[:, None]
        # exp(-|W_i - W_j|) is exp(W_i - W_j) for i >= j and exp(W_j - W_i) for i <= j (W falls
        # along the chunk), both <= 1
        dec = tl.exp(-tl.abs(W - W_j[None, :]))
        # exp(E_i - W_j) below the diagonal, exp(E_j - W_i) above it
        ex = tl.where(strict_lower, E - W_j[None, :], tl.where(strict_upper, E_j[None, :] - W, 0.))
        dec_ex = tl.exp(ex)
        # dr_i, da_i: partners j <= i (j < i), weights q[i, j]
        dr_ij = b_j[None, :] * _col(q_ds, idx, j)[:, None] + k_j[None, :] * _col(q_dv, idx, j)[:, None]
        b_dr += tl.where(lower, dec * dr_ij, 0.)
        da_ij = b_j[None, :] * _col(q_ps, idx, j)[:, None] + k_j[None, :] * _col(q_pv, idx, j)[:, None]
        b_da += tl.where(strict_lower, dec_ex * da_ij, 0.)
        # dk_i, db_i: partners j >= i (r) and j > i (a), weights q[j, i]
        r_dec = tl.where(upper, dec * r_j[None, :], 0.)
        a_dec = tl.where(strict_upper, dec_ex * a_j[None, :], 0.)
        b_dk += r_dec * _row(q_dv, idx, j)[:, None] + a_dec * _row(q_pv, idx, j)[:, None]
        b_db += r_dec * _row(q_ds, idx, j)[:, None] + a_dec * _row(q_ps, idx, j)[:, None]
        # dw_{j+1}: sources S0 and j' <= j (b_dr, b_da hold exactly those now) with sinks
        # i >= j + 1 (r) or i >= j + 2 (a, which enters the gradient one token early)
        if j < C - 1:
            sinks = (tl.where((idx > j)[:, None], b_r * b_dr, 0.)
                     + tl.where((idx > j + 1)[:, None], b_a * b_da, 0.))
            b_dw += tl.where((idx == j + 1)[:, None], tl.sum(sinks, axis=0)[None, :], 0.)
    return b_dr, b_da, b_dk, b_db, b_dw


@triton.jit
def _pair_grads_fast(b_dr, b_da, b_dk, b_db, b_dw, b_r, b_a, W, E, q_ds, q_dv, q_ps, q_pv, k, b,
                     i_b, i_h, T, H, K: tl.constexpr, t0, C: tl.constexpr, BK: tl.constexpr,
                     PRECISION: tl.constexpr):
    """`_pair_grads` as products, for chunks whose decay span is below FAST_SPAN: the pair
    weights exp(W_i - W_j) split into exp(W_i) exp(-W_j), neither beyond exp(FAST_SPAN)."""
    idx = tl.arange(0, C)
    lower = idx[:, None] >= idx[None, :]
    strict = idx[:, None] > idx[None, :]
    q_ds = tl.where(lower, q_ds, 0.)
    q_dv = tl.where(lower, q_dv, 0.)
    q_ps = tl.where(strict, q_ps, 0.)
    q_pv = tl.where(strict, q_pv, 0.)
    e_neg = tl.exp(-W)
    b_b = load_rows(b, i_b, i_h, T, H, K, t0, C, BK)
    b_k = load_rows(k, i_b, i_h, T, H, K, t0, C, BK)
    b_hat, k_hat = b_b * e_neg, b_k * e_neg
    r_t, a_t = b_r * tl.exp(W), b_a * tl.exp(E)
    b_dr += tl.exp(W) * (dot(q_ds, b_hat, PRECISION) + dot(q_dv, k_hat, PRECISION))
    b_da += tl.exp(E) * (dot(q_ps, b_hat, PRECISION) + dot(q_pv, k_hat, PRECISION))
    pair_k = e_neg * (dot(tl.trans(q_dv), r_t, PRECISION) + dot(tl.trans(q_pv), a_t, PRECISION))
    pair_b = e_neg * (dot(tl.trans(q_ds), r_t, PRECISION) + dot(tl.trans(q_ps), a_t, PRECISION))
    b_dk += pair_k
    b_db += pair_b
    # dw_t: the pairs (source j < t, sink i >= t, or > t for a) as all pairs with their sink
    # there (each sink's row sum is in b_dr, b_da, S0 included) less those with their source at
    # or after t (each in-chunk source's sum is in the pair parts of db, dk). A difference, but
    # over one chunk only, and under weak decay the straddling pairs are not small against it
    x_r, x_a = b_r * b_dr, b_a * b_da
    x_src = b_b * pair_b + b_k * pair_k
    b_dw += (tl.sum(x_r + x_a - x_src, axis=0)[None, :] - tl.cumsum(x_r + x_a - x_src, axis=0)
             + x_r - x_src)
    return b_dr, b_da, b_dk, b_db, b_dw


def _value_block(K: int, V: int) -> int:
    # as in the delta rule: 32-wide value blocks (16 crashed there on Hopper, Triton 3.6)
    return 32


def _launch_options(K: int) -> dict:
    # the chunk-parallel prep and output kernels. Untuned: the (C, K) float32 tiles of the prep's
    # column loop want 8 warps at K = 128 to stay in registers
    return {"num_warps": 8 if K > 64 else 4}


def _sequential_launch_options(K: int) -> dict:
    # the two kernels that walk the chunks in order carry only the (BK, BV) state, so the next
    # chunk's tiles can be loaded while the current one is used. Untuned: the delta rule's
    # measured choice for its sequential kernels
    return {"num_warps": 4, "num_stages": 3}


def _bwd_grad_launch_options(K: int) -> dict:
    # the gradient kernel holds about twenty (C, K) float32 tiles through its column loop.
    # Untuned: 8 warps; ptxas (sm_90) then reports 150-200 bytes of spills at K = 128 in bf16
    # and at K = 32 with float32-level tiles
    return {"num_warps": 8}


def _rwkv7_fwd(r, w, k, v, a, b, initial_state, output_final_state):
    B, T, H, K = r.shape
    V = v.shape[-1]
    C, BK, BV = CHUNK, block_size(K), block_size(V)
    NT = triton.cdiv(T, C)
    dev, f32 = r.device, torch.float32
    precision = dot_precision(r.dtype, K)
    inverse_precision = "tf32" if precision == "bf16" else precision
    mid = intermediate_dtype(precision)
    x, s = nan_buffer((B, T, H, V), mid, dev), nan_buffer((B, T, H, V), mid, dev)
    y, bbar, kbar, ybar, rt, at = (nan_buffer((B, T, H, K), mid, dev) for _ in range(6))
    gam = nan_buffer((B * H, NT, K), f32, dev)
    arl, arb, ark, aak = (nan_buffer((B * H, NT, C, C), mid, dev) for _ in range(4))
    _prep_fwd_kernel[(NT, B * H)](
        r, w, k, v, a, b, x, y, bbar, kbar, ybar, rt, at, gam, arl, arb, ark, aak, T, H, K, V, C,
        BK, BV, precision, inverse_precision, FAST_SPAN, **_launch_options(K))
    BV = _value_block(K, V)
    h = nan_buffer((B * H, NT, K, V), mid, dev)
    o = nan_buffer((B, T, H, V), v.dtype, dev)
    ht = nan_buffer((B, H, K, V), f32, dev) if output_final_state else None
    _fwd_state_kernel[(triton.cdiv(V, BV), B * H)](
        gam, v, x, y, bbar, kbar, h, s, initial_state, ht, T, H, K, V, C, BK, BV,
        initial_state is not None, output_final_state, precision, **_sequential_launch_options(K))
    _output_kernel[(triton.cdiv(V, BV), NT, B * H)](
        r, w, v, h, s, arb, ark, o, T, H, K, V, C, BK, BV, precision, **_launch_options(K))
    return o, ht, (h, s, ybar, rt, at, gam, arl, ark, aak)


def _rwkv7_bwd(r, w, k, v, a, b, initial_state, saved, do, dht):
    h, s, ybar, rt, at, gam, arl, ark, aak = saved
    B, T, H, K = r.shape
    V = v.shape[-1]
    C, BK, BV = CHUNK, block_size(K), _value_block(K, V)
    NT = triton.cdiv(T, C)
    dev, f32 = r.device, torch.float32
    precision = dot_precision(r.dtype, K)
    # the in-chunk pair sums of the fast path: tf32 also when the tiles are bf16 (as L^-1)
    pair_precision = "tf32" if precision == "bf16" else precision
    mid = intermediate_dtype(precision)
    dh, p = nan_buffer((B * H, NT, K, V), mid, dev), nan_buffer((B, T, H, V), mid, dev)
    dh0 = nan_buffer((B, H, K, V), f32, dev) if initial_state is not None else None
    _bwd_state_kernel[(triton.cdiv(V, BV), B * H)](
        rt, at, gam, ybar, do, arl, dh, p, dht, dh0, T, H, K, V, C, BK, BV,
        dht is not None, dh0 is not None, precision, **_sequential_launch_options(K))
    dr, dk, da, db = (nan_buffer(x.shape, x.dtype, dev) for x in (r, k, a, b))
    dv = nan_buffer(v.shape, v.dtype, dev)
    dw = nan_buffer(w.shape, w.dtype, dev)
    for exact in (False, True):
        _bwd_grad_kernel[(NT, B * H)](
            r, w, k, v, a, b, h, s, dh, p, do, ark, aak, dr, dw, dk, dv, da, db,
            T, H, K, V, C, BK, BV, precision, pair_precision, FAST_SPAN, exact,
            **_bwd_grad_launch_options(K))
    return dr, dw, dk, dv, da, db, dh0


class ChunkRWKV7Function(torch.autograd.Function):

    @staticmethod
    def forward(ctx, r, w, k, v, a, b, initial_state, output_final_state):
        o, ht, saved = _rwkv7_fwd(r, w, k, v, a, b, initial_state, output_final_state)
        ctx.save_for_backward(r, w, k, v, a, b, initial_state, *saved)
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        r, w, k, v, a, b, initial_state, *saved = ctx.saved_tensors
        grads = _rwkv7_bwd(r, w, k, v, a, b, initial_state, saved, do.contiguous(),
                           None if dht is None else dht.contiguous())
        return (*grads, None)


def chunk_rwkv7(
    r: torch.Tensor,
    w: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RWKV-7 time mixing in Triton, chunked (CHUNK tokens per chunk, chunks in parallel but for
    two light sequential kernels); differentiable in r, w, k, v, a, b and initial_state.

    Per token: S = S * exp(w)[:, None] + b (a^T S) + k v^T with a^T S read before the decay;
    o = S^T r. Same function as `ltm.ops.rwkv7.naive.naive_rwkv7`, which it is tested against.

    Args:
        r, w, k, a, b: [B, T, H, K]; v: [B, T, H, V]; all float32, bfloat16 or float16 (one dtype),
            K, V <= 128, any T >= 1. w is the log decay (<= 0), any strength: in-chunk decays are
            taken as exp of sums of w, never of their negatives.
        initial_state: [B, H, K, V] (any float dtype, used in float32) or None for zeros.
    Returns:
        o: [B, T, H, V] in the dtype of v; the final state [B, H, K, V] in float32 when
        `output_final_state`, else None. The running state is float32; bfloat16 inputs with
        K >= 64 are multiplied in bfloat16 tiles with float32 sums, and the per-chunk states and
        other intermediates saved for the output and the backward are then bfloat16
        (`ltm.kernels.common.dot_precision`).
    """
    check_rwkv7_inputs(r, w, k, v, a, b, initial_state)
    h0 = None if initial_state is None else initial_state.float().contiguous()
    return ChunkRWKV7Function.apply(*(x.contiguous() for x in (r, w, k, v, a, b)), h0,
                                    output_final_state)
