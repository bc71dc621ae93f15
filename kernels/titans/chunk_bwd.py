"""The Titans linear memory's backward in Triton (the forward's equations: chunk_fwd.py), in
three launches, so that the sequential pass does only what must be sequential:

`_titans_bwd_local_kernel` (one program per chunk): everything that needs only the chunk's
entering state and dO. With dA = -dO Delta^T on and below the diagonal:
    dq = a * (dO W^T) + b * (dO S^T) + (dA * Gamma * g) K,  da, db, dGamma,
    dDelta_local = -(Gamma * Q K^T * g)^T dO,  dg_local = colsum(dA * Gamma * Q K^T),
    dk_local = (dA * Gamma * g)^T Q,  dW_local = Q^T (a * dO) + K^T dDelta_local,
    dS_local = Q^T (b * dO),
and Delta itself, stored for the next two.
`_titans_bwd_state_kernel` (one program per batch and head, chunks backwards) carries dW', dS',
the gradients of the state after the chunk, and holds only their chain:
    dDelta_state = -(gamma_last * g) * (K dW') - (p_last * g) * (K dS') + 2 dn |k|^2 Delta
    dW     = a_end dW' + dW_local + K^T dDelta_state,   dS = e_end dS' + b_end dW' + dS_local
with dn, the gradient of n = |k|^2 |Delta|^2, -dg theta clip / (2 n) where the clip acts (n >
clip^2), else 0, and dg = dg_local - gamma_last * rowsum((K dW') * Delta) - p_last * rowsum((K
dS') * Delta). It stores each chunk's dW', dS' over dW_local, dS_local. `_titans_bwd_keys_kernel`
(one program per chunk) makes from them what the chain does not need: dg and dn again,
dDelta = dDelta_local + dDelta_state, dtheta = dg clip, dv = -dDelta, the gate rows' gradients and
    dk = dk_local + dDelta W^T - (gamma_last * g) * (Delta dW'^T) - (p_last * g) * (Delta dS'^T)
         + 2 dn |Delta|^2 k
and the chunk ends' gradients <W, dW'>, <S, dW'>, <S, dS'>. The gate tensors' gradients go back to
PyTorch, which takes them to alpha and eta.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ltm.kernels.common import dot
from ltm.kernels.titans.chunk_fwd import _chunk_program, _load_tokens


@triton.jit
def _store_tokens(ptr, x, i_b, i_h, t, mask_t, cols, mask_c, T, H: tl.constexpr, D: tl.constexpr):
    offs = ((i_b * T + t) * H + i_h)[:, None] * D + cols[None, :]
    tl.store(ptr + offs, x.to(ptr.dtype.element_ty), mask=mask_t[:, None] & mask_c[None, :])


@triton.jit
def _titans_bwd_local_kernel(q, k, v, do, a, b, gamma, w_states, s_states, g_in, dq, da, db,
                             dgamma, delta_out, ddelta, dg_local, dk_local, dws, dss, T, NT,
                             H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                             BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr):
    c, i_bh, i_b, i_h, rk, rv, rt, mk, mv, t, mt, state_offs, state_mask, W, S = _chunk_program(
        w_states, s_states, T, NT, H, K, V, BT, BK, BV)
    qt = _load_tokens(q, i_b, i_h, t, mt, rk, mk, T, H, K)  # (BT, BK)
    kt = _load_tokens(k, i_b, i_h, t, mt, rk, mk, T, H, K)
    vt = _load_tokens(v, i_b, i_h, t, mt, rv, mv, T, H, V)  # (BT, BV)
    dot_ = _load_tokens(do, i_b, i_h, t, mt, rv, mv, T, H, V)
    g_base = (i_bh * NT + c) * BT
    g = tl.load(g_in + g_base + rt)
    at, bt = tl.load(a + g_base + rt), tl.load(b + g_base + rt)
    gam_offs = (g_base + rt)[:, None] * BT + rt[None, :]
    gam = tl.load(gamma + gam_offs)  # (BT, BT)
    tok_v = (g_base + rt)[:, None] * V + rv[None, :]  # rows of the [.., NT * BT, V] buffers
    tok_k = (g_base + rt)[:, None] * K + rk[None, :]

    delta = dot(kt, W, PRECISION) - vt
    tl.store(delta_out + tok_v, delta, mask=mv[None, :])
    qk = dot(qt, tl.trans(kt), PRECISION)
    d_scores = tl.where(rt[:, None] >= rt[None, :], -dot(dot_, tl.trans(delta), PRECISION), 0.0)
    tl.store(dgamma + gam_offs, d_scores * qk * g[None, :])
    tl.store(dg_local + g_base + rt, tl.sum(d_scores * gam * qk, 0))
    d_qk = d_scores * gam * g[None, :]
    d_delta_local = -dot(tl.trans(gam * qk * g[None, :]), dot_, PRECISION)
    tl.store(ddelta + tok_v, d_delta_local, mask=mv[None, :])
    tl.store(dk_local + tok_k, dot(tl.trans(d_qk), qt, PRECISION), mask=mk[None, :])
    dq_t = (at[:, None] * dot(dot_, tl.trans(W), PRECISION)
            + bt[:, None] * dot(dot_, tl.trans(S), PRECISION) + dot(d_qk, kt, PRECISION))
    _store_tokens(dq, dq_t, i_b, i_h, t, mt, rk, mk, T, H, K)
    tl.store(da + g_base + rt, tl.sum(dot_ * dot(qt, W, PRECISION), 1))
    tl.store(db + g_base + rt, tl.sum(dot_ * dot(qt, S, PRECISION), 1))
    qt_t = tl.trans(qt)
    # K^T dDelta_local here, in parallel: the sequential pass adds only its own part of dDelta
    tl.store(dws + state_offs, dot(qt_t, at[:, None] * dot_, PRECISION)
             + dot(tl.trans(kt), d_delta_local, PRECISION), mask=state_mask)
    tl.store(dss + state_offs, dot(qt_t, bt[:, None] * dot_, PRECISION), mask=state_mask)


@triton.jit
def _dg_and_d_delta_state(k_dw, k_ds, kt, delta, g, wl, pl, dg_local, th, CLIP,
                          USE_CLIP: tl.constexpr):
    """A chunk's dg, its clip factor, the state's part of dDelta (BT, BV) and dn's coefficient of
    k in dk, 2 dn |Delta|^2, from K dW' and K dS' (see the module docstring)."""
    w_sum = -tl.sum(k_dw * delta, 1)  # d(gamma_last * g)
    s_sum = -tl.sum(k_ds * delta, 1)
    dg = dg_local + wl * w_sum + pl * s_sum
    d_delta = -(wl * g)[:, None] * k_dw - (pl * g)[:, None] * k_ds
    clip = tl.full(th.shape, 1.0, tl.float32)
    dk_coef = tl.zeros(th.shape, dtype=tl.float32)
    if USE_CLIP:
        k_sq, d_sq = tl.sum(kt * kt, 1), tl.sum(delta * delta, 1)
        norm_sq = k_sq * d_sq
        clip = CLIP / tl.sqrt(tl.maximum(norm_sq, CLIP * CLIP))
        d_norm = tl.where(norm_sq > CLIP * CLIP,
                          -(dg * th) * clip / (2 * tl.maximum(norm_sq, CLIP * CLIP)), 0.0)
        d_delta += (2 * d_norm * k_sq)[:, None] * delta
        dk_coef = 2 * d_norm * d_sq
    return dg, clip, d_delta, dk_coef, w_sum, s_sum


@triton.jit
def _chain_inputs(c, i_bh, i_b, i_h, k, theta, ends, w_last, p_last, g_in, delta_in, dg_local,
                  rk, rv, rt, mk, mv, T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BT: tl.constexpr):
    """What the chain reads of chunk c: none of it depends on the chain, so the kernel loads a
    chunk's inputs one chunk ahead, while the chain works on the chunk before."""
    t = c * BT + rt
    mt = t < T
    kt = _load_tokens(k, i_b, i_h, t, mt, rk, mk, T, H, K)
    th = tl.load(theta + (i_b * T + t) * H + i_h, mask=mt, other=0.0).to(tl.float32)
    rows = (i_bh * NT + c) * BT + rt
    delta = tl.load(delta_in + rows[:, None] * V + rv[None, :], mask=mv[None, :], other=0.0)
    e_offs = (i_bh * NT + c) * 3
    return (kt, th, delta, tl.load(g_in + rows), tl.load(w_last + rows),
            tl.load(p_last + rows), tl.load(dg_local + rows), tl.load(ends + e_offs),
            tl.load(ends + e_offs + 1), tl.load(ends + e_offs + 2))


@triton.jit
def _titans_bwd_state_kernel(k, theta, ends, w_last, p_last, g_in, delta_in, dg_local, dws, dss,
                             dwt, dst, dw0, ds0, T, NT, CLIP, H: tl.constexpr, K: tl.constexpr,
                             V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                             BV: tl.constexpr, USE_CLIP: tl.constexpr, USE_DHT: tl.constexpr,
                             PRECISION: tl.constexpr):
    i_bh = tl.program_id(0)
    i_b, i_h = i_bh // H, i_bh % H
    rk, rv, rt = tl.arange(0, BK), tl.arange(0, BV), tl.arange(0, BT)
    mk, mv = rk < K, rv < V
    state_mask = mk[:, None] & mv[None, :]
    dW = tl.zeros([BK, BV], dtype=tl.float32)  # the gradient of the state after the chunk
    dS = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        dW = tl.load(dwt + i_bh * K * V + rk[:, None] * V + rv[None, :], mask=state_mask, other=0.0)
        dS = tl.load(dst + i_bh * K * V + rk[:, None] * V + rv[None, :], mask=state_mask, other=0.0)
    kt, th, delta, g, wl, pl, dgl, a_end, b_end, e_end = _chain_inputs(
        NT - 1, i_bh, i_b, i_h, k, theta, ends, w_last, p_last, g_in, delta_in, dg_local, rk, rv,
        rt, mk, mv, T, NT, H, K, V, BT)
    for i in range(NT):
        c = NT - 1 - i
        # the next chunk's inputs first (chunk 0 again after the last), before dW' is stored
        # over this chunk's dW_local: their loads overlap this chunk's products
        (kt_next, th_next, delta_next, g_next, wl_next, pl_next, dgl_next,
         a_next, b_next, e_next) = _chain_inputs(
            tl.maximum(c - 1, 0), i_bh, i_b, i_h, k, theta, ends, w_last, p_last, g_in, delta_in,
            dg_local, rk, rv, rt, mk, mv, T, NT, H, K, V, BT)
        state_offs = (i_bh * NT + c) * K * V + rk[:, None] * V + rv[None, :]
        dW_local = tl.load(dws + state_offs, mask=state_mask, other=0.0)
        dS_local = tl.load(dss + state_offs, mask=state_mask, other=0.0)
        tl.store(dws + state_offs, dW, mask=state_mask)  # dW', dS' for the keys' kernel
        tl.store(dss + state_offs, dS, mask=state_mask)
        _, _, d_delta, _, _, _ = _dg_and_d_delta_state(
            dot(kt, dW, PRECISION), dot(kt, dS, PRECISION), kt, delta, g, wl, pl, dgl, th, CLIP,
            USE_CLIP)
        dW_prev = a_end * dW + dW_local + dot(tl.trans(kt), d_delta, PRECISION)
        dS = e_end * dS + b_end * dW + dS_local
        dW = dW_prev
        kt, th, delta = kt_next, th_next, delta_next
        g, wl, pl, dgl, a_end, b_end, e_end = g_next, wl_next, pl_next, dgl_next, a_next, b_next, e_next
    tl.store(dw0 + i_bh * K * V + rk[:, None] * V + rv[None, :], dW, mask=state_mask)
    tl.store(ds0 + i_bh * K * V + rk[:, None] * V + rv[None, :], dS, mask=state_mask)


@triton.jit
def _titans_bwd_keys_kernel(k, theta, w_last, p_last, w_states, s_states, g_in, delta_in, ddelta,
                            dg_local, dk_local, dws, dss, dk, dv, dtheta, dw_last, dp_last, dends,
                            T, NT, CLIP, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                            BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                            USE_CLIP: tl.constexpr, PRECISION: tl.constexpr):
    c, i_bh, i_b, i_h, rk, rv, rt, mk, mv, t, mt, state_offs, state_mask, W, S = _chunk_program(
        w_states, s_states, T, NT, H, K, V, BT, BK, BV)
    dW = tl.load(dws + state_offs, mask=state_mask, other=0.0)  # dW', dS': after the chunk
    dS = tl.load(dss + state_offs, mask=state_mask, other=0.0)
    e_offs = (i_bh * NT + c) * 3
    tl.store(dends + e_offs, tl.sum(tl.sum(W * dW, 1), 0))
    tl.store(dends + e_offs + 1, tl.sum(tl.sum(S * dW, 1), 0))
    tl.store(dends + e_offs + 2, tl.sum(tl.sum(S * dS, 1), 0))
    kt = _load_tokens(k, i_b, i_h, t, mt, rk, mk, T, H, K)
    th = tl.load(theta + (i_b * T + t) * H + i_h, mask=mt, other=0.0).to(tl.float32)
    g_base = (i_bh * NT + c) * BT
    tok_v = (g_base + rt)[:, None] * V + rv[None, :]
    delta = tl.load(delta_in + tok_v, mask=mv[None, :], other=0.0)
    g = tl.load(g_in + g_base + rt)
    wl, pl = tl.load(w_last + g_base + rt), tl.load(p_last + g_base + rt)
    dg, clip, d_delta, dk_coef, w_sum, s_sum = _dg_and_d_delta_state(
        dot(kt, dW, PRECISION), dot(kt, dS, PRECISION), kt, delta, g, wl, pl,
        tl.load(dg_local + g_base + rt), th, CLIP, USE_CLIP)
    d_delta += tl.load(ddelta + tok_v, mask=mv[None, :], other=0.0)
    tl.store(dw_last + g_base + rt, w_sum * g)
    tl.store(dp_last + g_base + rt, s_sum * g)
    tl.store(dtheta + (i_b * T + t) * H + i_h, dg * clip, mask=mt)
    _store_tokens(dv, -d_delta, i_b, i_h, t, mt, rv, mv, T, H, V)
    dk_t = (tl.load(dk_local + (g_base + rt)[:, None] * K + rk[None, :], mask=mk[None, :], other=0.0)
            + dot(d_delta, tl.trans(W), PRECISION)
            - (wl * g)[:, None] * dot(delta, tl.trans(dW), PRECISION)
            - (pl * g)[:, None] * dot(delta, tl.trans(dS), PRECISION)
            + dk_coef[:, None] * kt)
    _store_tokens(dk, dk_t, i_b, i_h, t, mt, rk, mk, T, H, K)
