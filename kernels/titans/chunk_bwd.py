"""The Titans linear memory's backward in one Triton kernel: one program per (batch, head) walks
the chunks backwards, carrying the gradients of the state after each chunk (dW', dS'), and
recomputes each chunk's forward from the states the forward stored (see chunk_fwd.py for the
forward's equations). Per chunk, with dA = -dO Delta^T on and below the diagonal:

    dDelta = -(Gamma * Q K^T * g)^T dO - (gamma_last * g) * (K dW') - (p_last * g) * (K dS')
             + (the clip's share: 2 dn |k|^2 Delta)
    dg     = colsum(dA * Gamma * Q K^T) - gamma_last * rowsum((K dW') * Delta)
             - p_last * rowsum((K dS') * Delta)
    dW     = a_end dW' + Q^T (a * dO) + K^T dDelta
    dS     = e_end dS' + b_end dW' + Q^T (b * dO)

where dn, the gradient of n = |k|^2 |Delta|^2, is -dclip * clip / (2 n) where the clip acts (n >
clip^2) and 0 elsewhere, with dclip = dg * theta and dtheta = dg * clip. The gate tensors' gradients
(da, db, dGamma, the chunk ends') go back to PyTorch, whose autograd takes them to alpha and eta.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ltm.kernels.common import dot
from ltm.kernels.titans.chunk_fwd import _clipped_step, _load_tokens


@triton.jit
def _store_tokens(ptr, x, i_b, i_h, t, mask_t, cols, mask_c, T, H: tl.constexpr, D: tl.constexpr):
    offs = ((i_b * T + t) * H + i_h)[:, None] * D + cols[None, :]
    tl.store(ptr + offs, x.to(ptr.dtype.element_ty), mask=mask_t[:, None] & mask_c[None, :])


@triton.jit
def _titans_bwd_kernel(q, k, v, theta, a, b, gamma, ends, w_last, p_last, w_states, s_states,
                       do, dwt, dst, dq, dk, dv, dtheta, da, db, dgamma, dends, dw_last, dp_last,
                       dw0, ds0, T, NT, CLIP, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                       BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                       USE_CLIP: tl.constexpr, USE_DHT: tl.constexpr, PRECISION: tl.constexpr):
    i_bh = tl.program_id(0)
    i_b, i_h = i_bh // H, i_bh % H
    rk, rv, rt = tl.arange(0, BK), tl.arange(0, BV), tl.arange(0, BT)
    mk, mv = rk < K, rv < V
    state_offs = rk[:, None] * V + rv[None, :]
    state_mask = mk[:, None] & mv[None, :]
    causal = rt[:, None] >= rt[None, :]
    dW = tl.zeros([BK, BV], dtype=tl.float32)  # gradient of the state after the chunk
    dS = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        dW = tl.load(dwt + i_bh * K * V + state_offs, mask=state_mask, other=0.0)
        dS = tl.load(dst + i_bh * K * V + state_offs, mask=state_mask, other=0.0)
    for i in range(NT):
        c = NT - 1 - i
        W = tl.load(w_states + (i_bh * NT + c) * K * V + state_offs, mask=state_mask, other=0.0)
        S = tl.load(s_states + (i_bh * NT + c) * K * V + state_offs, mask=state_mask, other=0.0)
        t = c * BT + rt
        mt = t < T
        qt = _load_tokens(q, i_b, i_h, t, mt, rk, mk, T, H, K)  # (BT, BK)
        kt = _load_tokens(k, i_b, i_h, t, mt, rk, mk, T, H, K)
        vt = _load_tokens(v, i_b, i_h, t, mt, rv, mv, T, H, V)  # (BT, BV)
        dot_ = _load_tokens(do, i_b, i_h, t, mt, rv, mv, T, H, V)
        th = tl.load(theta + (i_b * T + t) * H + i_h, mask=mt, other=0.0).to(tl.float32)
        g_base = (i_bh * NT + c) * BT
        at = tl.load(a + g_base + rt)
        bt = tl.load(b + g_base + rt)
        gam_offs = (g_base + rt)[:, None] * BT + rt[None, :]
        gam = tl.load(gamma + gam_offs)  # (BT, BT)
        e_offs = (i_bh * NT + c) * 3
        a_end, b_end, e_end = tl.load(ends + e_offs), tl.load(ends + e_offs + 1), tl.load(ends + e_offs + 2)
        wl = tl.load(w_last + g_base + rt)
        pl = tl.load(p_last + g_base + rt)

        # the forward, again
        delta = dot(kt, W, PRECISION) - vt  # (BT, BV)
        clip, g = _clipped_step(kt, delta, th, CLIP, USE_CLIP)
        qk = dot(qt, tl.trans(kt), PRECISION)  # (BT, BT)
        scores = gam * qk * g[None, :]

        # through the chunk-end states W' and S'
        k_dw = dot(kt, dW, PRECISION)  # (BT, BV): K dW'
        k_ds = dot(kt, dS, PRECISION)
        w_sum = -tl.sum(k_dw * delta, 1)  # d(gamma_last * g)
        s_sum = -tl.sum(k_ds * delta, 1)
        tl.store(dw_last + g_base + rt, w_sum * g)
        tl.store(dp_last + g_base + rt, s_sum * g)
        tl.store(dends + e_offs, tl.sum(tl.sum(W * dW, 1), 0))
        tl.store(dends + e_offs + 1, tl.sum(tl.sum(S * dW, 1), 0))
        tl.store(dends + e_offs + 2, tl.sum(tl.sum(S * dS, 1), 0))
        # through the outputs
        d_scores = tl.where(causal, -dot(dot_, tl.trans(delta), PRECISION), 0.0)  # (BT, BT)
        tl.store(dgamma + gam_offs, d_scores * qk * g[None, :])
        d_qk = d_scores * gam * g[None, :]
        dg = tl.sum(d_scores * gam * qk, 0) + wl * w_sum + pl * s_sum
        d_delta = (-dot(tl.trans(scores), dot_, PRECISION) - (wl * g)[:, None] * k_dw
                   - (pl * g)[:, None] * k_ds)
        dk_t = (dot(tl.trans(d_qk), qt, PRECISION)
                - (wl * g)[:, None] * dot(delta, tl.trans(dW), PRECISION)
                - (pl * g)[:, None] * dot(delta, tl.trans(dS), PRECISION))
        if USE_CLIP:
            norm_sq = tl.sum(kt * kt, 1) * tl.sum(delta * delta, 1)
            d_norm = tl.where(norm_sq > CLIP * CLIP,
                              -(dg * th) * clip / (2 * tl.maximum(norm_sq, CLIP * CLIP)), 0.0)
            d_delta += (2 * d_norm * tl.sum(kt * kt, 1))[:, None] * delta
            dk_t += (2 * d_norm * tl.sum(delta * delta, 1))[:, None] * kt
        dk_t += dot(d_delta, tl.trans(W), PRECISION)
        dq_t = (at[:, None] * dot(dot_, tl.trans(W), PRECISION)
                + bt[:, None] * dot(dot_, tl.trans(S), PRECISION) + dot(d_qk, kt, PRECISION))
        _store_tokens(dq, dq_t, i_b, i_h, t, mt, rk, mk, T, H, K)
        _store_tokens(dk, dk_t, i_b, i_h, t, mt, rk, mk, T, H, K)
        _store_tokens(dv, -d_delta, i_b, i_h, t, mt, rv, mv, T, H, V)
        tl.store(dtheta + (i_b * T + t) * H + i_h, dg * clip, mask=mt)
        tl.store(da + g_base + rt, tl.sum(dot_ * dot(qt, W, PRECISION), 1))
        tl.store(db + g_base + rt, tl.sum(dot_ * dot(qt, S, PRECISION), 1))
        # the gradients of the state entering the chunk
        qt_t = tl.trans(qt)
        dW_prev = (a_end * dW + dot(qt_t, at[:, None] * dot_, PRECISION)
                   + dot(tl.trans(kt), d_delta, PRECISION))
        dS = e_end * dS + b_end * dW + dot(qt_t, bt[:, None] * dot_, PRECISION)
        dW = dW_prev
    tl.store(dw0 + i_bh * K * V + state_offs, dW, mask=state_mask)
    tl.store(ds0 + i_bh * K * V + state_offs, dS, mask=state_mask)
