"""The Titans linear memory's forward in one Triton kernel: one program per (batch, head) walks
the chunks in order with the memory W [K, V] and its momentum S [K, V] in registers.

Per chunk of BT tokens entering with (W, S), with the gate products a, b, Gamma and the chunk-end
factors made in PyTorch (`chunk.py`, `chunk_gates`):
    Delta = K W - V                              (each token's error at the chunk's weights)
    g     = theta * min(1, clip / (|k| |Delta|))  (the clipped step; |k_s Delta_s^T| = |k||Delta|)
    O     = a * (Q W) + b * (Q S) - (Gamma * Q K^T * g) Delta
    W'    = a_end W + b_end S - K^T ((gamma_last * g) * Delta)
    S'    = e_end S - K^T ((p_last * g) * Delta)
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
def _clipped_step(kt, delta, th, CLIP, USE_CLIP: tl.constexpr):
    """Each token's clip factor and clipped step g = theta * clip, [BT] each."""
    if USE_CLIP:
        norm_sq = tl.sum(kt * kt, 1) * tl.sum(delta * delta, 1)
        clip = CLIP / tl.sqrt(tl.maximum(norm_sq, CLIP * CLIP))
    else:
        clip = tl.full(th.shape, 1.0, tl.float32)
    return clip, th * clip


@triton.jit
def _titans_fwd_kernel(q, k, v, theta, a, b, gamma, ends, w_last, p_last, w0, s0, o,
                       w_states, s_states, wt, st, T, NT, CLIP, H: tl.constexpr, K: tl.constexpr,
                       V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                       USE_CLIP: tl.constexpr, USE_H0: tl.constexpr, STORE_STATES: tl.constexpr,
                       STORE_FINAL: tl.constexpr, PRECISION: tl.constexpr):
    i_bh = tl.program_id(0)
    i_b, i_h = i_bh // H, i_bh % H
    rk, rv, rt = tl.arange(0, BK), tl.arange(0, BV), tl.arange(0, BT)
    mk, mv = rk < K, rv < V
    state_offs = rk[:, None] * V + rv[None, :]
    state_mask = mk[:, None] & mv[None, :]
    W = tl.zeros([BK, BV], dtype=tl.float32)
    S = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        W = tl.load(w0 + i_bh * K * V + state_offs, mask=state_mask, other=0.0)
        S = tl.load(s0 + i_bh * K * V + state_offs, mask=state_mask, other=0.0)
    for c in range(NT):
        if STORE_STATES:
            tl.store(w_states + (i_bh * NT + c) * K * V + state_offs, W, mask=state_mask)
            tl.store(s_states + (i_bh * NT + c) * K * V + state_offs, S, mask=state_mask)
        t = c * BT + rt
        mt = t < T
        qt = _load_tokens(q, i_b, i_h, t, mt, rk, mk, T, H, K)  # (BT, BK)
        kt = _load_tokens(k, i_b, i_h, t, mt, rk, mk, T, H, K)
        vt = _load_tokens(v, i_b, i_h, t, mt, rv, mv, T, H, V)  # (BT, BV)
        th = tl.load(theta + (i_b * T + t) * H + i_h, mask=mt, other=0.0).to(tl.float32)
        g_base = (i_bh * NT + c) * BT
        at = tl.load(a + g_base + rt)
        bt = tl.load(b + g_base + rt)
        gam = tl.load(gamma + (g_base + rt)[:, None] * BT + rt[None, :])  # (BT, BT)
        a_end = tl.load(ends + (i_bh * NT + c) * 3)
        b_end = tl.load(ends + (i_bh * NT + c) * 3 + 1)
        e_end = tl.load(ends + (i_bh * NT + c) * 3 + 2)
        wl = tl.load(w_last + g_base + rt)
        pl = tl.load(p_last + g_base + rt)

        delta = dot(kt, W, PRECISION) - vt  # (BT, BV)
        clip, g = _clipped_step(kt, delta, th, CLIP, USE_CLIP)
        scores = gam * dot(qt, tl.trans(kt), PRECISION) * g[None, :]  # (BT, BT), lower
        ot = (at[:, None] * dot(qt, W, PRECISION) + bt[:, None] * dot(qt, S, PRECISION)
              - dot(scores, delta, PRECISION))
        o_offs = ((i_b * T + t) * H + i_h)[:, None] * V + rv[None, :]
        tl.store(o + o_offs, ot.to(o.dtype.element_ty), mask=mt[:, None] & mv[None, :])
        kt_t = tl.trans(kt)
        W_next = (a_end * W + b_end * S
                  - dot(kt_t, (wl * g)[:, None] * delta, PRECISION))
        S = e_end * S - dot(kt_t, (pl * g)[:, None] * delta, PRECISION)
        W = W_next
    if STORE_FINAL:
        tl.store(wt + i_bh * K * V + state_offs, W, mask=state_mask)
        tl.store(st + i_bh * K * V + state_offs, S, mask=state_mask)
