"""The deep Titans memory's forward in Triton (two layers, SiLU between; the equations:
`deep_reference.py`): a sequential pass over the chunks for the states, then every chunk's outputs
in parallel.

The memory is non-linear in the weights a chunk starts from, so the chunks follow one another:
`_deep_states_kernel`, one program per batch and head, walks them. Its state (W1, S1 [K, E], W2,
S2 [E, V], 128 KB in float32 at K = V = 64, E = 128) does not fit in one program's registers, so
it lives in global memory, in the per-chunk buffers the backward needs anyway: the program reads
chunk c's entering state from slot c and writes the state after the chunk to slot c + 1 (slot NT
is the final state), tiles of BE hidden units at a time. Per chunk three passes over the hidden
tiles: (A) z1 = k W1, h1 = silu(z1), z2 += h1 W2; (B) d1 = (d2 W2^T) silu'(z1) and the norms of
the clip; (C) the hand-off to the next state. z1, d1, d2 and g go to token buffers for the output
kernel and the backward. `_deep_output_kernel`, one program per chunk, batch and head, reads the
memory in the dual form from the chunk's entering state and those buffers.

Between passes that hand data through global memory to other threads of the same program a
`tl.debug_barrier()` (a block-wide barrier, which orders global memory within the block) stands.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ltm.kernels.common import dot, rounded
from ltm.kernels.titans.chunk_fwd import _load_tokens


@triton.jit
def silu(z):
    return z * tl.sigmoid(z)


@triton.jit
def silu_grad(z):
    s = tl.sigmoid(z)
    return s * (1 + z * (1 - s))


@triton.jit
def mat_tile(ptr, rows, mask_r, cols, mask_c, N_COLS: tl.constexpr):
    """Pointers and mask of the (rows, cols) tile of the row-major matrix at ptr with N_COLS
    columns."""
    return ptr + rows[:, None] * N_COLS + cols[None, :], mask_r[:, None] & mask_c[None, :]


@triton.jit
def load(ptrs_mask):
    ptrs, mask = ptrs_mask
    return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def store(ptrs_mask, x):
    """Store x, rounded to nearest even into the tensor's dtype (also under the interpreter)."""
    ptrs, mask = ptrs_mask
    tl.store(ptrs, rounded(x, ptrs.dtype.element_ty), mask=mask)


@triton.jit
def load_ends(ends, i_bh, NT, c):
    """a, b and E at the chunk's last token."""
    offs = (i_bh * NT + c) * 3
    return tl.load(ends + offs), tl.load(ends + offs + 1), tl.load(ends + offs + 2)


@triton.jit
def _deep_states_kernel(k, v, theta, ends, w_last, p_last, w1s, s1s, w2s, s2s, z1_buf, d1_buf,
                        d2_buf, g_buf, T, NT, CLIP, H: tl.constexpr, K: tl.constexpr,
                        E: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                        BE: tl.constexpr, BV: tl.constexpr, USE_CLIP: tl.constexpr,
                        PRECISION: tl.constexpr):
    i_bh = tl.program_id(0)
    i_b, i_h = i_bh // H, i_bh % H
    rk, re, rv, rt = tl.arange(0, BK), tl.arange(0, BE), tl.arange(0, BV), tl.arange(0, BT)
    mk, mv, all_t = rk < K, rv < V, rt < BT
    for c in range(NT):
        t = c * BT + rt
        mt = t < T
        kt = _load_tokens(k, i_b, i_h, t, mt, rk, mk, T, H, K)  # (BT, BK)
        vt = _load_tokens(v, i_b, i_h, t, mt, rv, mv, T, H, V)  # (BT, BV)
        th = tl.load(theta + (i_b * T + t) * H + i_h, mask=mt, other=0.0).to(tl.float32)
        slot = (i_bh * (NT + 1) + c).to(tl.int64)
        w1, s1 = w1s + slot * (K * E), s1s + slot * (K * E)  # chunk c's entering state
        w2, s2 = w2s + slot * (E * V), s2s + slot * (E * V)
        rows = (i_bh * NT + c).to(tl.int64) * BT + rt  # the chunk's rows of the token buffers
        # (A) z1 = k W1 per hidden tile, z2 = silu(z1) W2 summed over them
        z2 = tl.zeros([BT, BV], dtype=tl.float32)
        h_sq = tl.zeros([BT], dtype=tl.float32)
        for e0 in range(0, E, BE):
            ce = e0 + re
            me = ce < E
            z1 = dot(kt, load(mat_tile(w1, rk, mk, ce, me, E)), PRECISION)
            h1 = silu(z1)
            store(mat_tile(z1_buf, rows, all_t, ce, me, E), z1)
            z2 += dot(h1, load(mat_tile(w2, ce, me, rv, mv, V)), PRECISION)
            h_sq += tl.sum(h1 * h1, 1)
        d2 = z2 - vt
        store(mat_tile(d2_buf, rows, all_t, rv, mv, V), d2)
        tl.debug_barrier()
        # (B) d1 = (d2 W2^T) silu'(z1)
        d1_sq = tl.zeros([BT], dtype=tl.float32)
        for e0 in range(0, E, BE):
            ce = e0 + re
            me = ce < E
            z1 = load(mat_tile(z1_buf, rows, all_t, ce, me, E))
            w2_t = load(mat_tile(w2, ce, me, rv, mv, V))
            d1 = dot(d2, tl.trans(w2_t), PRECISION) * silu_grad(z1)
            store(mat_tile(d1_buf, rows, all_t, ce, me, E), d1)
            d1_sq += tl.sum(d1 * d1, 1)
        if USE_CLIP:
            norm = tl.sum(kt * kt, 1) * d1_sq + h_sq * tl.sum(d2 * d2, 1)
            g = th * CLIP / tl.sqrt(tl.maximum(norm, CLIP * CLIP))
        else:
            g = th
        tl.store(g_buf + rows, g)
        tl.debug_barrier()
        # (C) the state after the chunk into slot c + 1
        a_end, b_end, e_end = load_ends(ends, i_bh, NT, c)
        wg = tl.load(w_last + rows) * g
        pg = tl.load(p_last + rows) * g
        kt_t = tl.trans(kt)
        for e0 in range(0, E, BE):
            ce = e0 + re
            me = ce < E
            d1 = load(mat_tile(d1_buf, rows, all_t, ce, me, E))
            h1 = silu(load(mat_tile(z1_buf, rows, all_t, ce, me, E)))
            w_tile, s_tile = mat_tile(w1, rk, mk, ce, me, E), mat_tile(s1, rk, mk, ce, me, E)
            w_old, s_old = load(w_tile), load(s_tile)
            store(mat_tile(w1 + K * E, rk, mk, ce, me, E),
                  a_end * w_old + b_end * s_old - dot(kt_t, wg[:, None] * d1, PRECISION))
            store(mat_tile(s1 + K * E, rk, mk, ce, me, E),
                  e_end * s_old - dot(kt_t, pg[:, None] * d1, PRECISION))
            h1_t = tl.trans(h1)
            w_tile, s_tile = mat_tile(w2, ce, me, rv, mv, V), mat_tile(s2, ce, me, rv, mv, V)
            w_old, s_old = load(w_tile), load(s_tile)
            store(mat_tile(w2 + E * V, ce, me, rv, mv, V),
                  a_end * w_old + b_end * s_old - dot(h1_t, wg[:, None] * d2, PRECISION))
            store(mat_tile(s2 + E * V, ce, me, rv, mv, V),
                  e_end * s_old - dot(h1_t, pg[:, None] * d2, PRECISION))
        tl.debug_barrier()


@triton.jit
def _deep_output_kernel(q, k, a, b, gamma, w1s, s1s, w2s, s2s, z1_buf, d1_buf, d2_buf, g_buf, o,
                        T, NT, H: tl.constexpr, K: tl.constexpr, E: tl.constexpr,
                        V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BE: tl.constexpr,
                        BV: tl.constexpr, PRECISION: tl.constexpr):
    c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    rk, re, rv, rt = tl.arange(0, BK), tl.arange(0, BE), tl.arange(0, BV), tl.arange(0, BT)
    mk, mv, all_t = rk < K, rv < V, rt < BT
    t = c * BT + rt
    mt = t < T
    qt = _load_tokens(q, i_b, i_h, t, mt, rk, mk, T, H, K)
    kt = _load_tokens(k, i_b, i_h, t, mt, rk, mk, T, H, K)
    slot = (i_bh * (NT + 1) + c).to(tl.int64)
    w1, s1 = w1s + slot * (K * E), s1s + slot * (K * E)
    w2, s2 = w2s + slot * (E * V), s2s + slot * (E * V)
    rows = (i_bh * NT + c).to(tl.int64) * BT + rt
    g = tl.load(g_buf + rows)
    at, bt = tl.load(a + rows), tl.load(b + rows)
    gg = tl.load(gamma + rows[:, None] * BT + rt[None, :]) * g[None, :]  # (BT, BT), lower
    scores1 = gg * dot(qt, tl.trans(kt), PRECISION)
    ot = tl.zeros([BT, BV], dtype=tl.float32)
    rh = tl.zeros([BT, BT], dtype=tl.float32)  # r1 h1^T, summed over the hidden tiles
    for e0 in range(0, E, BE):
        ce = e0 + re
        me = ce < E
        y1 = (at[:, None] * dot(qt, load(mat_tile(w1, rk, mk, ce, me, E)), PRECISION)
              + bt[:, None] * dot(qt, load(mat_tile(s1, rk, mk, ce, me, E)), PRECISION)
              - dot(scores1, load(mat_tile(d1_buf, rows, all_t, ce, me, E)), PRECISION))
        r1 = silu(y1)
        h1 = silu(load(mat_tile(z1_buf, rows, all_t, ce, me, E)))
        ot += (dot(at[:, None] * r1, load(mat_tile(w2, ce, me, rv, mv, V)), PRECISION)
               + dot(bt[:, None] * r1, load(mat_tile(s2, ce, me, rv, mv, V)), PRECISION))
        rh += dot(r1, tl.trans(h1), PRECISION)
    d2 = load(mat_tile(d2_buf, rows, all_t, rv, mv, V))
    ot -= dot(gg * rh, d2, PRECISION)
    o_offs = ((i_b * T + t) * H + i_h)[:, None] * V + rv[None, :]
    tl.store(o + o_offs, rounded(ot, o.dtype.element_ty), mask=mt[:, None] & mv[None, :])
