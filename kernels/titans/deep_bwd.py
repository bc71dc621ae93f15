"""The deep Titans memory's backward in Triton (the formulas: `deep_reference.py`,
`deep_chunk_backward`), in two launches:

`_deep_bwd_local_kernel` (one program per chunk, batch and head): the reads' backward, which
needs only the chunk's entering state, the forward's token buffers and dO. Two passes over the
hidden tiles: the first sums r1 h1^T (the layer-2 scores need the whole hidden width), the second
takes dO back through layer 2 and SiLU to layer 1. It writes dq (complete), the gate products'
gradients da, db, dGamma, and for the state kernel dk, dg, dd1, dd2 and dh1 as the reads see them
and the reads' gradients of the entering state (into slots 0 .. NT-1 of the state-gradient
buffers; slot NT holds the gradient of the final state).

`_deep_bwd_state_kernel` (one program per batch and head, chunks backwards) carries the gradient
of the state after the chunk (slot c + 1) through the hand-off, the clip and the deltas, and
writes the gradient of the chunk's entering state over slot c (whose reads' part it has read
first): three passes over the hidden tiles per chunk, (1) the hand-off's sums over the hidden
width (h1 dW2', the gradient of wl g and pl g), then the clip; (2) dd1 complete and
dz2 = dd2 + (dd1 silu'(z1)) W2; (3) dh1, dz1, dk and the entering state's gradient. Slot 0 ends as
the gradient of the initial state.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ltm.kernels.common import dot, rounded
from ltm.kernels.titans.chunk_fwd import _load_tokens
from ltm.kernels.titans.deep_fwd import load, load_ends, mat_tile, silu, silu_grad, store


@triton.jit
def silu_grad2(z):
    s = tl.sigmoid(z)
    return s * (1 - s) * (2 + z * (1 - 2 * s))


@triton.jit
def _deep_bwd_local_kernel(q, k, do, a, b, gamma, w1s, s1s, w2s, s2s, z1_buf, d1_buf, d2_buf,
                           g_buf, dq, da, db, dgamma, dg_buf, dk_buf, dd1_buf, dh1_buf, dd2_buf,
                           dw1s, ds1s, dw2s, ds2s, T, NT, H: tl.constexpr, K: tl.constexpr,
                           E: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                           BE: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr):
    c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    rk, re, rv, rt = tl.arange(0, BK), tl.arange(0, BE), tl.arange(0, BV), tl.arange(0, BT)
    mk, mv, all_t = rk < K, rv < V, rt < BT
    t = c * BT + rt
    mt = t < T
    qt = _load_tokens(q, i_b, i_h, t, mt, rk, mk, T, H, K)
    kt = _load_tokens(k, i_b, i_h, t, mt, rk, mk, T, H, K)
    dot_ = _load_tokens(do, i_b, i_h, t, mt, rv, mv, T, H, V)
    slot = (i_bh * (NT + 1) + c).to(tl.int64)
    w1, s1 = w1s + slot * (K * E), s1s + slot * (K * E)
    w2, s2 = w2s + slot * (E * V), s2s + slot * (E * V)
    rows = (i_bh * NT + c).to(tl.int64) * BT + rt
    g = tl.load(g_buf + rows)
    at, bt = tl.load(a + rows), tl.load(b + rows)
    gam_offs = rows[:, None] * BT + rt[None, :]
    gam = tl.load(gamma + gam_offs)
    gg = gam * g[None, :]
    lower = rt[:, None] >= rt[None, :]
    qk = dot(qt, tl.trans(kt), PRECISION)
    d2 = load(mat_tile(d2_buf, rows, all_t, rv, mv, V))
    # pass 1: r1 h1^T over the whole hidden width
    rh = tl.zeros([BT, BT], dtype=tl.float32)
    for e0 in range(0, E, BE):
        ce = e0 + re
        me = ce < E
        y1 = (at[:, None] * dot(qt, load(mat_tile(w1, rk, mk, ce, me, E)), PRECISION)
              + bt[:, None] * dot(qt, load(mat_tile(s1, rk, mk, ce, me, E)), PRECISION)
              - dot(gg * qk, load(mat_tile(d1_buf, rows, all_t, ce, me, E)), PRECISION))
        h1 = silu(load(mat_tile(z1_buf, rows, all_t, ce, me, E)))
        rh += dot(silu(y1), tl.trans(h1), PRECISION)
    d_a2 = tl.where(lower, -dot(dot_, tl.trans(d2), PRECISION), 0.0)  # d(Gg o r1 h1^T)
    m2 = d_a2 * gg
    store(mat_tile(dd2_buf, rows, all_t, rv, mv, V), -dot(tl.trans(gg * rh), dot_, PRECISION))
    # pass 2: back through layer 2 and the SiLU to layer 1, tile by tile
    d_a1 = tl.zeros([BT, BT], dtype=tl.float32)
    dq_t = tl.zeros([BT, BK], dtype=tl.float32)
    da_t = tl.zeros([BT], dtype=tl.float32)
    db_t = tl.zeros([BT], dtype=tl.float32)
    qt_t = tl.trans(qt)
    dslot = (i_bh * (NT + 1) + c).to(tl.int64)
    for e0 in range(0, E, BE):
        ce = e0 + re
        me = ce < E
        w1_t = load(mat_tile(w1, rk, mk, ce, me, E))
        s1_t = load(mat_tile(s1, rk, mk, ce, me, E))
        d1 = load(mat_tile(d1_buf, rows, all_t, ce, me, E))
        qw, qs = dot(qt, w1_t, PRECISION), dot(qt, s1_t, PRECISION)
        y1 = at[:, None] * qw + bt[:, None] * qs - dot(gg * qk, d1, PRECISION)
        r1 = silu(y1)
        h1 = silu(load(mat_tile(z1_buf, rows, all_t, ce, me, E)))
        do_w = dot(dot_, tl.trans(load(mat_tile(w2, ce, me, rv, mv, V))), PRECISION)
        do_s = dot(dot_, tl.trans(load(mat_tile(s2, ce, me, rv, mv, V))), PRECISION)
        dy1 = (at[:, None] * do_w + bt[:, None] * do_s + dot(m2, h1, PRECISION)) * silu_grad(y1)
        da_t += tl.sum(r1 * do_w, 1) + tl.sum(dy1 * qw, 1)
        db_t += tl.sum(r1 * do_s, 1) + tl.sum(dy1 * qs, 1)
        store(mat_tile(dh1_buf, rows, all_t, ce, me, E), dot(tl.trans(m2), r1, PRECISION))
        store(mat_tile(dd1_buf, rows, all_t, ce, me, E),
              -dot(tl.trans(gg * qk), dy1, PRECISION))
        d_a1 -= dot(dy1, tl.trans(d1), PRECISION)
        dq_t += (dot(at[:, None] * dy1, tl.trans(w1_t), PRECISION)
                 + dot(bt[:, None] * dy1, tl.trans(s1_t), PRECISION))
        r1_t = tl.trans(r1)
        store(mat_tile(dw1s + dslot * (K * E), rk, mk, ce, me, E),
              dot(qt_t, at[:, None] * dy1, PRECISION))
        store(mat_tile(ds1s + dslot * (K * E), rk, mk, ce, me, E),
              dot(qt_t, bt[:, None] * dy1, PRECISION))
        store(mat_tile(dw2s + dslot * (E * V), ce, me, rv, mv, V),
              dot(r1_t, at[:, None] * dot_, PRECISION))
        store(mat_tile(ds2s + dslot * (E * V), ce, me, rv, mv, V),
              dot(r1_t, bt[:, None] * dot_, PRECISION))
    d_a1 = tl.where(lower, d_a1, 0.0)
    m1 = d_a1 * gg
    dq_t += dot(m1, kt, PRECISION)
    tok = ((i_b * T + t) * H + i_h)[:, None] * K + rk[None, :]
    tl.store(dq + tok, rounded(dq_t, dq.dtype.element_ty), mask=mt[:, None] & mk[None, :])
    store(mat_tile(dk_buf, rows, all_t, rk, mk, K), dot(tl.trans(m1), qt, PRECISION))
    tl.store(da + rows, da_t)
    tl.store(db + rows, db_t)
    tl.store(dgamma + gam_offs, (d_a2 * rh + d_a1 * qk) * g[None, :])
    tl.store(dg_buf + rows, tl.sum(d_a2 * gam * rh, 0) + tl.sum(d_a1 * gam * qk, 0))


@triton.jit
def _deep_bwd_state_kernel(k, theta, ends, w_last, p_last, w1s, s1s, w2s, s2s, z1_buf, d1_buf,
                           d2_buf, g_buf, dg_buf, dk_buf, dd1_buf, dh1_buf, dd2_buf, dw1s, ds1s,
                           dw2s, ds2s, dk, dv, dtheta, dends, dw_last, dp_last, T, NT, CLIP,
                           H: tl.constexpr, K: tl.constexpr, E: tl.constexpr, V: tl.constexpr,
                           BT: tl.constexpr, BK: tl.constexpr, BE: tl.constexpr,
                           BV: tl.constexpr, USE_CLIP: tl.constexpr, PRECISION: tl.constexpr):
    i_bh = tl.program_id(0)
    i_b, i_h = i_bh // H, i_bh % H
    rk, re, rv, rt = tl.arange(0, BK), tl.arange(0, BE), tl.arange(0, BV), tl.arange(0, BT)
    mk, mv, all_t = rk < K, rv < V, rt < BT
    for i in range(NT):
        c = NT - 1 - i
        t = c * BT + rt
        mt = t < T
        kt = _load_tokens(k, i_b, i_h, t, mt, rk, mk, T, H, K)
        th = tl.load(theta + (i_b * T + t) * H + i_h, mask=mt, other=0.0).to(tl.float32)
        slot = (i_bh * (NT + 1) + c).to(tl.int64)
        w1, s1 = w1s + slot * (K * E), s1s + slot * (K * E)
        w2, s2 = w2s + slot * (E * V), s2s + slot * (E * V)
        # the state gradients: after the chunk (in) and of its entering state (out, over the
        # reads' part there)
        dw1_out, ds1_out = dw1s + slot * (K * E), ds1s + slot * (K * E)
        dw2_out, ds2_out = dw2s + slot * (E * V), ds2s + slot * (E * V)
        dw1_in, ds1_in = dw1_out + K * E, ds1_out + K * E
        dw2_in, ds2_in = dw2_out + E * V, ds2_out + E * V
        rows = (i_bh * NT + c).to(tl.int64) * BT + rt
        g = tl.load(g_buf + rows)
        wl, pl = tl.load(w_last + rows), tl.load(p_last + rows)
        wg, pg = wl * g, pl * g
        d2 = load(mat_tile(d2_buf, rows, all_t, rv, mv, V))
        dk_t = load(mat_tile(dk_buf, rows, all_t, rk, mk, K))
        # (1) the hand-off's sums over the hidden width, layer 1's tiles, then layer 2's: in one
        # loop both layers' gradient tiles were live at once, and ptxas (sm_90a, bf16, K = V = 64,
        # E = 128, chunk 16, 8 warps) spilled 792 bytes a thread against 364 in two
        h_dw = tl.zeros([BT, BV], dtype=tl.float32)  # h1 dW2'
        h_ds = tl.zeros([BT, BV], dtype=tl.float32)
        w_sum = tl.zeros([BT], dtype=tl.float32)  # the gradient of wl g
        s_sum = tl.zeros([BT], dtype=tl.float32)
        h_sq = tl.zeros([BT], dtype=tl.float32)
        d1_sq = tl.zeros([BT], dtype=tl.float32)
        for e0 in range(0, E, BE):
            ce = e0 + re
            me = ce < E
            d1 = load(mat_tile(d1_buf, rows, all_t, ce, me, E))
            dw1n = load(mat_tile(dw1_in, rk, mk, ce, me, E))
            ds1n = load(mat_tile(ds1_in, rk, mk, ce, me, E))
            w_sum -= tl.sum(dot(kt, dw1n, PRECISION) * d1, 1)
            s_sum -= tl.sum(dot(kt, ds1n, PRECISION) * d1, 1)
            dk_t -= (dot(wg[:, None] * d1, tl.trans(dw1n), PRECISION)
                     + dot(pg[:, None] * d1, tl.trans(ds1n), PRECISION))
            d1_sq += tl.sum(d1 * d1, 1)
        for e0 in range(0, E, BE):
            ce = e0 + re
            me = ce < E
            h1 = silu(load(mat_tile(z1_buf, rows, all_t, ce, me, E)))
            h_dw += dot(h1, load(mat_tile(dw2_in, ce, me, rv, mv, V)), PRECISION)
            h_ds += dot(h1, load(mat_tile(ds2_in, ce, me, rv, mv, V)), PRECISION)
            h_sq += tl.sum(h1 * h1, 1)
        w_sum -= tl.sum(h_dw * d2, 1)
        s_sum -= tl.sum(h_ds * d2, 1)
        tl.store(dw_last + rows, w_sum * g)
        tl.store(dp_last + rows, s_sum * g)
        dg = tl.load(dg_buf + rows) + wl * w_sum + pl * s_sum
        k_sq, d2_sq = tl.sum(kt * kt, 1), tl.sum(d2 * d2, 1)
        clip = tl.full([BT], 1.0, tl.float32)
        d_norm = tl.zeros([BT], dtype=tl.float32)
        if USE_CLIP:
            norm = k_sq * d1_sq + h_sq * d2_sq
            clip = CLIP / tl.sqrt(tl.maximum(norm, CLIP * CLIP))
            d_norm = tl.where(norm > CLIP * CLIP,
                              -(dg * th) * clip / (2 * tl.maximum(norm, CLIP * CLIP)), 0.0)
        tl.store(dtheta + (i_b * T + t) * H + i_h, dg * clip, mask=mt)
        dk_t += (2 * d_norm * d1_sq)[:, None] * kt
        dz2 = (load(mat_tile(dd2_buf, rows, all_t, rv, mv, V)) - wg[:, None] * h_dw
               - pg[:, None] * h_ds + (2 * d_norm * h_sq)[:, None] * d2)
        # (2) dd1 complete (over the reads' part), dz2 = dd2 + (dd1 silu'(z1)) W2
        for e0 in range(0, E, BE):
            ce = e0 + re
            me = ce < E
            dd1_tile = mat_tile(dd1_buf, rows, all_t, ce, me, E)
            d1 = load(mat_tile(d1_buf, rows, all_t, ce, me, E))
            z1 = load(mat_tile(z1_buf, rows, all_t, ce, me, E))
            dd1 = (load(dd1_tile)
                   - wg[:, None] * dot(kt, load(mat_tile(dw1_in, rk, mk, ce, me, E)), PRECISION)
                   - pg[:, None] * dot(kt, load(mat_tile(ds1_in, rk, mk, ce, me, E)), PRECISION)
                   + (2 * d_norm * k_sq)[:, None] * d1)
            dz2 += dot(dd1 * silu_grad(z1), load(mat_tile(w2, ce, me, rv, mv, V)), PRECISION)
            tl.debug_barrier()  # every thread has read the tile before it is overwritten
            store(dd1_tile, dd1)
        tok_v = ((i_b * T + t) * H + i_h)[:, None] * V + rv[None, :]
        tl.store(dv + tok_v, rounded(-dz2, dv.dtype.element_ty), mask=mt[:, None] & mv[None, :])
        tl.debug_barrier()
        # (3) dh1, dz1, dk and the gradient of the entering state
        a_end, b_end, e_end = load_ends(ends, i_bh, NT, c)
        sum_a = 0.0
        sum_b = 0.0
        sum_e = 0.0
        kt_t = tl.trans(kt)
        for e0 in range(0, E, BE):
            ce = e0 + re
            me = ce < E
            z1 = load(mat_tile(z1_buf, rows, all_t, ce, me, E))
            h1, sp = silu(z1), silu_grad(z1)
            dd1 = load(mat_tile(dd1_buf, rows, all_t, ce, me, E))
            # layer 2 first, then layer 1: a phase's (BE, V) or (K, BE) tiles die before the
            # next one's are loaded
            w2_t = load(mat_tile(w2, ce, me, rv, mv, V))
            dw2n = load(mat_tile(dw2_in, ce, me, rv, mv, V))
            ds2n = load(mat_tile(ds2_in, ce, me, rv, mv, V))
            s2_t = load(mat_tile(s2, ce, me, rv, mv, V))
            dh1 = (load(mat_tile(dh1_buf, rows, all_t, ce, me, E))
                   - dot(wg[:, None] * d2, tl.trans(dw2n), PRECISION)
                   - dot(pg[:, None] * d2, tl.trans(ds2n), PRECISION)
                   + (2 * d_norm * d2_sq)[:, None] * h1 + dot(dz2, tl.trans(w2_t), PRECISION))
            dz1 = dd1 * dot(d2, tl.trans(w2_t), PRECISION) * silu_grad2(z1) + dh1 * sp
            sum_a += tl.sum(tl.sum(w2_t * dw2n, 1), 0)
            sum_b += tl.sum(tl.sum(s2_t * dw2n, 1), 0)
            sum_e += tl.sum(tl.sum(s2_t * ds2n, 1), 0)
            dw2_tile = mat_tile(dw2_out, ce, me, rv, mv, V)
            ds2_tile = mat_tile(ds2_out, ce, me, rv, mv, V)
            dw2 = (a_end * dw2n + load(dw2_tile) + dot(tl.trans(dd1 * sp), d2, PRECISION)
                   + dot(tl.trans(h1), dz2, PRECISION))
            ds2 = e_end * ds2n + b_end * dw2n + load(ds2_tile)
            tl.debug_barrier()  # every thread has read the reads' part before it is overwritten
            store(dw2_tile, dw2)
            store(ds2_tile, ds2)
            w1_t = load(mat_tile(w1, rk, mk, ce, me, E))
            dw1n = load(mat_tile(dw1_in, rk, mk, ce, me, E))
            ds1n = load(mat_tile(ds1_in, rk, mk, ce, me, E))
            s1_t = load(mat_tile(s1, rk, mk, ce, me, E))
            dk_t += dot(dz1, tl.trans(w1_t), PRECISION)
            sum_a += tl.sum(tl.sum(w1_t * dw1n, 1), 0)
            sum_b += tl.sum(tl.sum(s1_t * dw1n, 1), 0)
            sum_e += tl.sum(tl.sum(s1_t * ds1n, 1), 0)
            dw1_tile = mat_tile(dw1_out, rk, mk, ce, me, E)
            ds1_tile = mat_tile(ds1_out, rk, mk, ce, me, E)
            dw1 = a_end * dw1n + load(dw1_tile) + dot(kt_t, dz1, PRECISION)
            ds1 = e_end * ds1n + b_end * dw1n + load(ds1_tile)
            tl.debug_barrier()
            store(dw1_tile, dw1)
            store(ds1_tile, ds1)
        e_offs = (i_bh * NT + c) * 3
        tl.store(dends + e_offs, sum_a)
        tl.store(dends + e_offs + 1, sum_b)
        tl.store(dends + e_offs + 2, sum_e)
        tok_k = ((i_b * T + t) * H + i_h)[:, None] * K + rk[None, :]
        tl.store(dk + tok_k, rounded(dk_t, dk.dtype.element_ty), mask=mt[:, None] & mk[None, :])
        tl.debug_barrier()
