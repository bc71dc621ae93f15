"""The chunked (gated) delta rule's prep kernel (chunk-parallel), the first of the forward's launches
(`chunk.py` launches it and gives the maths; `chunk_fwd.py` holds the kernels after it).

`_prep_fwd_kernel`: per chunk (`_prep_chunk`; on looping programs with bf16 tiles,
`launch_choices._prep_persistent`) the in-chunk cumulative log decay G, L^-1 block by block,
W = L^-1 (beta exp(G) K) and U = L^-1 (beta V), and for a forward with a backward L^-1 itself.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ltm.kernels.common import (dot, invert_unit_lower, invert_unit_lower_by_squaring, load_rows, rounded,
                                store_rows)


@triton.jit
def _a_block(k_i, k_j, beta_i, G_i, G_j, mask, PRECISION: tl.constexpr):
    """One (BC, BC) block of A = beta_i k_i.k_j exp(G_i - G_j), zero where `mask` is false."""
    kk = dot(k_i, tl.trans(k_j), PRECISION)
    return tl.where(mask, beta_i[:, None] * kk * tl.exp(G_i[:, None] - G_j[None, :]), 0.)


@triton.jit
def _a_below(k0, k1, k2, k3, b1, b2, b3, G0, G1, G2, G3, m1, m2, m3, PRECISION: tl.constexpr):
    """A's six (BC, BC) blocks below the diagonal blocks: a10, a20, a21, a30, a31, a32."""
    return (_a_block(k1, k0, b1, G1, G0, m1[:, None], PRECISION),
            _a_block(k2, k0, b2, G2, G0, m2[:, None], PRECISION),
            _a_block(k2, k1, b2, G2, G1, m2[:, None], PRECISION),
            _a_block(k3, k0, b3, G3, G0, m3[:, None], PRECISION),
            _a_block(k3, k1, b3, G3, G1, m3[:, None], PRECISION),
            _a_block(k3, k2, b3, G3, G2, m3[:, None], PRECISION))


@triton.jit
def _prep_fwd_kernel(k, v, beta, g, w, u, gcum, linv, ready, T, H, HQ, K: tl.constexpr,
                     V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                     PRECISION: tl.constexpr, INV_PRECISION: tl.constexpr, SQUARING: tl.constexpr,
                     STORE_LINV: tl.constexpr, JOBS, PERSISTENT: tl.constexpr, NREADY,
                     ZERO_READY: tl.constexpr, USE_G: tl.constexpr, STORE_WU: tl.constexpr):
    # ZERO_READY: the programs also zero the NREADY counters of the overlapped launch that follows
    # (`_fwd_overlapped_kernel`'s `ready`), so that the forward has no memset launch of its own
    if ZERO_READY:
        _zero_counts(ready, NREADY)
    # PERSISTENT: grid (P,), program p takes chunks p, p + P, ... of the JOBS = NT B H (chunk
    # i_bh NT + i_t), so that Triton loads the next chunk's beta and decays while this one is
    # worked (num_stages; launch_choices.PREP_PROGRAMS_PER_SM); otherwise grid (NT, B H), one
    # chunk per program
    if PERSISTENT:
        NT = tl.cdiv(T, BT)
        for job in range(tl.program_id(0), JOBS, tl.num_programs(0)):
            _prep_chunk(k, v, beta, g, w, u, gcum, linv, job % NT, job // NT, T, H, HQ, K, V, BT, BK,
                        BV, PRECISION, INV_PRECISION, SQUARING, STORE_LINV, USE_G, STORE_WU)
    else:
        _prep_chunk(k, v, beta, g, w, u, gcum, linv, tl.program_id(0), tl.program_id(1), T, H, HQ, K,
                    V, BT, BK, BV, PRECISION, INV_PRECISION, SQUARING, STORE_LINV, USE_G, STORE_WU)


@triton.jit
def _zero_counts(ready, NREADY):
    # ready[:NREADY] = 0, spread over every program of the (1-D or 2-D) grid
    n_programs = tl.num_programs(0) * tl.num_programs(1)
    pid = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    offs = tl.arange(0, 128)
    for start in range(pid * 128, NREADY, n_programs * 128):
        tl.store(ready + start + offs, tl.zeros([128], dtype=tl.int32), mask=start + offs < NREADY)


@triton.jit
def _prep_chunk(k, v, beta, g, w, u, gcum, linv, i_t, i_bh, T, H, HQ, K: tl.constexpr,
                V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                PRECISION: tl.constexpr, INV_PRECISION: tl.constexpr, SQUARING: tl.constexpr,
                STORE_LINV: tl.constexpr, USE_G: tl.constexpr, STORE_WU: tl.constexpr):
    # L^-1 block by block: the chunk is 4 sub-chunks of BC rows; each diagonal block is inverted
    # by forward substitution and X_ij = -X_ii sum_{j<=m<i} A_im X_mj fills the rest
    tl.static_assert(BT == 64, "the block inverse is written for 64-token chunks")
    BC: tl.constexpr = 16
    i_b, i_h = i_bh // H, i_bh % H
    i_hq = i_h % HQ  # the head of q, k, v this state reads
    NT = tl.cdiv(T, BT)
    idx = tl.arange(0, BC)
    t0 = i_t * BT
    rows0, rows1, rows2, rows3 = t0 + idx, t0 + BC + idx, t0 + 2 * BC + idx, t0 + 3 * BC + idx
    m0, m1, m2, m3 = rows0 < T, rows1 < T, rows2 < T, rows3 < T
    k0 = load_rows(k, i_b, i_hq, T, HQ, K, t0, BC, BK)
    k1 = load_rows(k, i_b, i_hq, T, HQ, K, t0 + BC, BC, BK)
    k2 = load_rows(k, i_b, i_hq, T, HQ, K, t0 + 2 * BC, BC, BK)
    k3 = load_rows(k, i_b, i_hq, T, HQ, K, t0 + 3 * BC, BC, BK)
    pb = beta + (i_b * T) * H + i_h
    b0 = tl.load(pb + rows0 * H, mask=m0, other=0.).to(tl.float32)
    b1 = tl.load(pb + rows1 * H, mask=m1, other=0.).to(tl.float32)
    b2 = tl.load(pb + rows2 * H, mask=m2, other=0.).to(tl.float32)
    b3 = tl.load(pb + rows3 * H, mask=m3, other=0.).to(tl.float32)
    if USE_G:
        pg = g + (i_b * T) * H + i_h
        G0 = tl.cumsum(tl.load(pg + rows0 * H, mask=m0, other=0.).to(tl.float32), axis=0)
        G1 = tl.cumsum(tl.load(pg + rows1 * H, mask=m1, other=0.).to(tl.float32), axis=0)
        G2 = tl.cumsum(tl.load(pg + rows2 * H, mask=m2, other=0.).to(tl.float32), axis=0)
        G3 = tl.cumsum(tl.load(pg + rows3 * H, mask=m3, other=0.).to(tl.float32), axis=0)
        G1 += tl.sum(tl.where(idx == BC - 1, G0, 0.))
        G2 += tl.sum(tl.where(idx == BC - 1, G1, 0.))
        G3 += tl.sum(tl.where(idx == BC - 1, G2, 0.))
    else:
        # the plain delta rule (g None): no decay, G = 0 (exp(0) = 1 exactly, so the products
        # below are the same as with a g of zeros, without its fill and loads)
        G0 = tl.zeros([BC], dtype=tl.float32)
        G1, G2, G3 = G0, G0, G0
    # rows past the end of the sequence are masked out: exp(G_i - G_j) is meaningless there
    strict = idx[:, None] > idx[None, :]
    a00 = _a_block(k0, k0, b0, G0, G0, strict & m0[:, None], PRECISION)
    a11 = _a_block(k1, k1, b1, G1, G1, strict & m1[:, None], PRECISION)
    a22 = _a_block(k2, k2, b2, G2, G2, strict & m2[:, None], PRECISION)
    a33 = _a_block(k3, k3, b3, G3, G3, strict & m3[:, None], PRECISION)
    # bf16 tiles: every block of A before the inverse, so that the four (BC, BK) key tiles die
    # here (prep 0.093 against 0.100 ms at 2,8192,8,128, 0.179 against 0.195 at 32,2048,4,128;
    # H100). float32 tiles keep the blocks below the diagonal for after it: formed first, at K =
    # 128 their launch failed on an H100 ("operation not supported on global/shared address
    # space", a kernel that spills tens of KB per thread there)
    if PRECISION == "bf16":
        a10, a20, a21, a30, a31, a32 = _a_below(k0, k1, k2, k3, b1, b2, b3, G0, G1, G2, G3, m1, m2, m3,
                                                PRECISION)
    if SQUARING:
        x00 = invert_unit_lower_by_squaring(a00, BC, INV_PRECISION)
        x11 = invert_unit_lower_by_squaring(a11, BC, INV_PRECISION)
        x22 = invert_unit_lower_by_squaring(a22, BC, INV_PRECISION)
        x33 = invert_unit_lower_by_squaring(a33, BC, INV_PRECISION)
    else:
        x00 = invert_unit_lower(a00, BC)
        x11 = invert_unit_lower(a11, BC)
        x22 = invert_unit_lower(a22, BC)
        x33 = invert_unit_lower(a33, BC)
    if PRECISION != "bf16":
        a10, a20, a21, a30, a31, a32 = _a_below(k0, k1, k2, k3, b1, b2, b3, G0, G1, G2, G3, m1, m2, m3,
                                                PRECISION)
    # L^-1 is built in INV_PRECISION (tf32, or tf32x3 on the float32-level path) also when the
    # tiles are bf16: only its products with K and V below take PRECISION
    x10 = -dot(x11, dot(a10, x00, INV_PRECISION), INV_PRECISION)
    x21 = -dot(x22, dot(a21, x11, INV_PRECISION), INV_PRECISION)
    x32 = -dot(x33, dot(a32, x22, INV_PRECISION), INV_PRECISION)
    s20 = dot(a20, x00, INV_PRECISION) + dot(a21, x10, INV_PRECISION)
    x20 = -dot(x22, s20, INV_PRECISION)
    s31 = dot(a31, x11, INV_PRECISION) + dot(a32, x21, INV_PRECISION)
    x31 = -dot(x33, s31, INV_PRECISION)
    s30 = dot(a30, x00, INV_PRECISION) + dot(a31, x10, INV_PRECISION) + dot(a32, x20, INV_PRECISION)
    x30 = -dot(x33, s30, INV_PRECISION)
    # W = L^-1 (beta exp(G) K) and U = L^-1 (beta V), the keys read again (from L2) once A is
    # formed (bf16: ptxas spills 172 against 292 bytes per thread with A formed first). W and U in
    # 64- or 32-column parts, fewer live registers, were slower (0.100-0.103, 0.121-0.123 ms)
    # (STORE_WU off: a forward whose state pass makes D from L^-1, `_deltas_from_linv`)
    if STORE_WU:
        sw0, sw1, sw2, sw3 = b0 * tl.exp(G0), b1 * tl.exp(G1), b2 * tl.exp(G2), b3 * tl.exp(G3)
        _lower_times(x00, x10, x11, x20, x21, x22, x30, x31, x32, x33, k, w, sw0, sw1, sw2, sw3,
                     i_b, i_hq, i_h, T, H, HQ, K, t0, BC, BK, PRECISION)
        _lower_times(x00, x10, x11, x20, x21, x22, x30, x31, x32, x33, v, u, b0, b1, b2, b3,
                     i_b, i_hq, i_h, T, H, HQ, V, t0, BC, BV, PRECISION)
    pG = gcum + (i_b * T) * H + i_h
    tl.store(pG + rows0 * H, G0, mask=m0)
    tl.store(pG + rows1 * H, G1, mask=m1)
    tl.store(pG + rows2 * H, G2, mask=m2)
    tl.store(pG + rows3 * H, G3, mask=m3)
    if STORE_LINV:
        _store_linv(linv, i_bh * NT + i_t, x00, x10, x11, x20, x21, x22, x30, x31, x32, x33, BT, BC)


@triton.jit
def _lower_times(x00, x10, x11, x20, x21, x22, x30, x31, x32, x33, src, dst, r0, r1, r2, r3, i_b,
                 i_hq, i_h, T, H, HQ, D: tl.constexpr, t0, BC: tl.constexpr, BD: tl.constexpr,
                 PRECISION: tl.constexpr):
    # dst = L^-1 (r * src) for the chunk at t0 (L^-1 by its (BC, BC) blocks x_ij, r scaling src's
    # rows), row block by row block: src read from head i_hq of HQ, dst written to head i_h of H.
    # (Scaling x_ij's columns instead, so that src goes straight into the products, did not make
    # Triton pipeline its loads: the prep 65 against 67 us at 2,8192,8,128 but 87 against 83 at
    # 8,2048,16,64; H100, gpu/results/prep-column-scale-h100-2026-11-26-s19-call3.diff of a40e938)
    z0 = load_rows(src, i_b, i_hq, T, HQ, D, t0, BC, BD) * r0[:, None]
    z1 = load_rows(src, i_b, i_hq, T, HQ, D, t0 + BC, BC, BD) * r1[:, None]
    z2 = load_rows(src, i_b, i_hq, T, HQ, D, t0 + 2 * BC, BC, BD) * r2[:, None]
    z3 = load_rows(src, i_b, i_hq, T, HQ, D, t0 + 3 * BC, BC, BD) * r3[:, None]
    store_rows(dst, dot(x00, z0, PRECISION), i_b, i_h, T, H, D, t0, BC, BD)
    y1 = dot(x10, z0, PRECISION) + dot(x11, z1, PRECISION)
    store_rows(dst, y1, i_b, i_h, T, H, D, t0 + BC, BC, BD)
    y2 = dot(x20, z0, PRECISION) + dot(x21, z1, PRECISION) + dot(x22, z2, PRECISION)
    store_rows(dst, y2, i_b, i_h, T, H, D, t0 + 2 * BC, BC, BD)
    y3 = (dot(x30, z0, PRECISION) + dot(x31, z1, PRECISION) + dot(x32, z2, PRECISION)
          + dot(x33, z3, PRECISION))
    store_rows(dst, y3, i_b, i_h, T, H, D, t0 + 3 * BC, BC, BD)


@triton.jit
def _store_linv(linv, i_mat, x00, x10, x11, x20, x21, x22, x30, x31, x32, x33, BT: tl.constexpr,
                BC: tl.constexpr):
    # the full (BT, BT) L^-1 for the backward (not stored by a forward without one), upper blocks zero
    idx = tl.arange(0, BC)
    p_l = linv + i_mat * BT * BT + idx[:, None] * BT + idx[None, :]
    zero = tl.zeros([BC, BC], dtype=tl.float32)
    l_dtype = linv.dtype.element_ty
    tl.store(p_l, rounded(x00, l_dtype))
    tl.store(p_l + BC, rounded(zero, l_dtype))
    tl.store(p_l + 2 * BC, rounded(zero, l_dtype))
    tl.store(p_l + 3 * BC, rounded(zero, l_dtype))
    tl.store(p_l + BC * BT, rounded(x10, l_dtype))
    tl.store(p_l + BC * BT + BC, rounded(x11, l_dtype))
    tl.store(p_l + BC * BT + 2 * BC, rounded(zero, l_dtype))
    tl.store(p_l + BC * BT + 3 * BC, rounded(zero, l_dtype))
    tl.store(p_l + 2 * BC * BT, rounded(x20, l_dtype))
    tl.store(p_l + 2 * BC * BT + BC, rounded(x21, l_dtype))
    tl.store(p_l + 2 * BC * BT + 2 * BC, rounded(x22, l_dtype))
    tl.store(p_l + 2 * BC * BT + 3 * BC, rounded(zero, l_dtype))
    tl.store(p_l + 3 * BC * BT, rounded(x30, l_dtype))
    tl.store(p_l + 3 * BC * BT + BC, rounded(x31, l_dtype))
    tl.store(p_l + 3 * BC * BT + 2 * BC, rounded(x32, l_dtype))
    tl.store(p_l + 3 * BC * BT + 3 * BC, rounded(x33, l_dtype))
