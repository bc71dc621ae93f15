"""Backward kernels of the chunked RWKV-7 recurrence; `chunk.py` launches them and gives the maths.

`_bwd_state_kernel` (sequential, backwards over chunks): Gc and P. `_bwd_grad_kernel`
(chunk-parallel): every input gradient, launched once per in-chunk path, each program skipping
the other path's chunks; its in-chunk pair sums are `_pair_grads` (exact column loops) and
`_pair_grads_fast` (products, for weak decay).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ltm.kernels.common import dot, load_rows, load_tile, seq_tile, state_tile, store_rows, store_tile
from ltm.kernels.rwkv7.chunk_fwd import _cc_ptrs, _col, _decays, _row, _token_row


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
        p_dht = state_tile(dht, i_bh, K, V, v0, BK, BV)
        b_G += load_tile(p_dht).to(tl.float32)
    for j in range(NT):
        i_t = NT - 1 - j
        t0 = i_t * C
        p_dh = state_tile(dh, i_bh * NT + i_t, K, V, v0, BK, BV)
        store_tile(p_dh, b_G)
        tv = (i_b * T * H + i_h) * V
        p_do = seq_tile(do, i_b, i_h, T, H, V, t0, v0, C, BV)
        p_p = seq_tile(p, i_b, i_h, T, H, V, t0, v0, C, BV)
        b_do = load_tile(p_do).to(tl.float32)
        b_arl = tl.load(_cc_ptrs(arl, i_bh, i_t, NT, C))
        b_ybar = load_rows(ybar, i_b, i_h, T, H, K, t0, C, BK)
        b_p = dot(tl.trans(b_arl), b_do, PRECISION) + dot(b_ybar, b_G, PRECISION)
        store_tile(p_p, b_p)
        o_k = tl.arange(0, BK)
        b_gam = tl.load(gam + (i_bh * NT + i_t) * K + o_k, mask=o_k < K, other=0.)
        b_rt = load_rows(rt, i_b, i_h, T, H, K, t0, C, BK)
        b_at = load_rows(at, i_b, i_h, T, H, K, t0, C, BK)
        b_G = (b_G * b_gam[:, None] + dot(tl.trans(b_rt), b_do, PRECISION)
               + dot(tl.trans(b_at), b_p, PRECISION))
    if STORE_DH0:
        p_dh0 = state_tile(dh0, i_bh, K, V, v0, BK, BV)
        store_tile(p_dh0, b_G)


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
            p_h = state_tile(h, i_bh * NT + i_t, K, V, v0, BK, BV)
            p_dh = state_tile(dh, i_bh * NT + i_t, K, V, v0, BK, BV)
            tv = (i_b * T * H + i_h) * V
            p_v = seq_tile(v, i_b, i_h, T, H, V, t0, v0, C, BV)
            p_s = seq_tile(s, i_b, i_h, T, H, V, t0, v0, C, BV)
            p_p = seq_tile(p, i_b, i_h, T, H, V, t0, v0, C, BV)
            p_do = seq_tile(do, i_b, i_h, T, H, V, t0, v0, C, BV)
            p_dv = seq_tile(dv, i_b, i_h, T, H, V, t0, v0, C, BV)
            b_h = load_tile(p_h)
            b_dh = load_tile(p_dh)
            b_v = load_tile(p_v).to(tl.float32)
            b_s = load_tile(p_s)
            b_p = load_tile(p_p)
            b_do = load_tile(p_do).to(tl.float32)
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
            store_tile(p_dv, b_dv)
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
