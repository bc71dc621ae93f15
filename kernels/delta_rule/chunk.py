"""Chunked (gated) delta rule in Triton, forward and backward.

Per chunk of BT tokens, with G the in-chunk cumulative log decay and S0 the state entering it:
    A    = strict_lower(beta_i k_i.k_j exp(G_i - G_j)),  L = I + A
    W    = L^-1 (beta exp(G) K),  U = L^-1 (beta V),  D = U - W S0     (D: the applied deltas)
    O    = scale [exp(G) Q S0 + (causal exp(G_i - G_j) Q K^T) D]
    S_BT = exp(G_last) S0 + (exp(G_last - G) K)^T D
Kernels: `_prep_fwd_kernel` (chunk-parallel: L^-1, W, U), `_fwd_kernel` (sequential over chunks:
states and D), `_output_kernel` (chunk-parallel: O), `_bwd_local_kernel` (chunk-parallel: the in-chunk parts of dD and of the state gradients),
`_bwd_state_kernel` (sequential, backwards: the rest of dD and of the state gradients),
`_bwd_chunk_kernel` (chunk-parallel: dq, dk, dv, dbeta, dg). Tested against
`ltm.ops.delta_rule.naive.naive_delta_rule`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ltm.kernels.common import (block_size, check_btd, check_dtype, check_head_dim, check_state,
                                dot, dot_precision, intermediate_dtype, invert_unit_lower,
                                invert_unit_lower_by_squaring, load_rows, nan_buffer, rounded,
                                store_rows)

# Tokens per chunk. 64 keeps the in-chunk matrices on the tensor cores and the number of sequential
# steps low; the tail chunk of a sequence whose length is no multiple of it is masked.
CHUNK = 64
# Invert L's 16 x 16 diagonal blocks by repeated squaring (tensor cores) rather than forward
# substitution (15 dependent row updates); gpu/delta_rule_variants.py times the two.
INVERSE_BY_SQUARING = True


@triton.jit
def _a_block(k_i, k_j, beta_i, G_i, G_j, mask, PRECISION: tl.constexpr):
    """One (BC, BC) block of A = beta_i k_i.k_j exp(G_i - G_j), zero where `mask` is false."""
    kk = dot(k_i, tl.trans(k_j), PRECISION)
    return tl.where(mask, beta_i[:, None] * kk * tl.exp(G_i[:, None] - G_j[None, :]), 0.)


@triton.jit
def _prep_fwd_kernel(k, v, beta, g, w, u, gcum, linv, T, H, K: tl.constexpr,
                     V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                     PRECISION: tl.constexpr, INV_PRECISION: tl.constexpr, SQUARING: tl.constexpr):
    # L^-1 block by block: the chunk is 4 sub-chunks of BC rows; each diagonal block is inverted
    # by forward substitution and X_ij = -X_ii sum_{j<=m<i} A_im X_mj fills the rest
    tl.static_assert(BT == 64, "the block inverse is written for 64-token chunks")
    BC: tl.constexpr = 16
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    NT = tl.cdiv(T, BT)
    idx = tl.arange(0, BC)
    t0 = i_t * BT
    rows0, rows1, rows2, rows3 = t0 + idx, t0 + BC + idx, t0 + 2 * BC + idx, t0 + 3 * BC + idx
    m0, m1, m2, m3 = rows0 < T, rows1 < T, rows2 < T, rows3 < T
    k0 = load_rows(k, i_b, i_h, T, H, K, t0, BC, BK)
    k1 = load_rows(k, i_b, i_h, T, H, K, t0 + BC, BC, BK)
    k2 = load_rows(k, i_b, i_h, T, H, K, t0 + 2 * BC, BC, BK)
    k3 = load_rows(k, i_b, i_h, T, H, K, t0 + 3 * BC, BC, BK)
    pb = beta + (i_b * T) * H + i_h
    b0 = tl.load(pb + rows0 * H, mask=m0, other=0.).to(tl.float32)
    b1 = tl.load(pb + rows1 * H, mask=m1, other=0.).to(tl.float32)
    b2 = tl.load(pb + rows2 * H, mask=m2, other=0.).to(tl.float32)
    b3 = tl.load(pb + rows3 * H, mask=m3, other=0.).to(tl.float32)
    pg = g + (i_b * T) * H + i_h
    G0 = tl.cumsum(tl.load(pg + rows0 * H, mask=m0, other=0.).to(tl.float32), axis=0)
    G1 = tl.cumsum(tl.load(pg + rows1 * H, mask=m1, other=0.).to(tl.float32), axis=0)
    G2 = tl.cumsum(tl.load(pg + rows2 * H, mask=m2, other=0.).to(tl.float32), axis=0)
    G3 = tl.cumsum(tl.load(pg + rows3 * H, mask=m3, other=0.).to(tl.float32), axis=0)
    G1 += tl.sum(tl.where(idx == BC - 1, G0, 0.))
    G2 += tl.sum(tl.where(idx == BC - 1, G1, 0.))
    G3 += tl.sum(tl.where(idx == BC - 1, G2, 0.))
    # rows past the end of the sequence are masked out: exp(G_i - G_j) is meaningless there
    strict = idx[:, None] > idx[None, :]
    a00 = _a_block(k0, k0, b0, G0, G0, strict & m0[:, None], PRECISION)
    a11 = _a_block(k1, k1, b1, G1, G1, strict & m1[:, None], PRECISION)
    a22 = _a_block(k2, k2, b2, G2, G2, strict & m2[:, None], PRECISION)
    a33 = _a_block(k3, k3, b3, G3, G3, strict & m3[:, None], PRECISION)
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
    a10 = _a_block(k1, k0, b1, G1, G0, m1[:, None], PRECISION)
    a20 = _a_block(k2, k0, b2, G2, G0, m2[:, None], PRECISION)
    a21 = _a_block(k2, k1, b2, G2, G1, m2[:, None], PRECISION)
    a30 = _a_block(k3, k0, b3, G3, G0, m3[:, None], PRECISION)
    a31 = _a_block(k3, k1, b3, G3, G1, m3[:, None], PRECISION)
    a32 = _a_block(k3, k2, b3, G3, G2, m3[:, None], PRECISION)
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
    # W = L^-1 (beta exp(G) K), row block by row block
    y0, y1 = k0 * (b0 * tl.exp(G0))[:, None], k1 * (b1 * tl.exp(G1))[:, None]
    y2, y3 = k2 * (b2 * tl.exp(G2))[:, None], k3 * (b3 * tl.exp(G3))[:, None]
    store_rows(w, dot(x00, y0, PRECISION), i_b, i_h, T, H, K, t0, BC, BK)
    w1 = dot(x10, y0, PRECISION) + dot(x11, y1, PRECISION)
    store_rows(w, w1, i_b, i_h, T, H, K, t0 + BC, BC, BK)
    w2 = (dot(x20, y0, PRECISION) + dot(x21, y1, PRECISION)
          + dot(x22, y2, PRECISION))
    store_rows(w, w2, i_b, i_h, T, H, K, t0 + 2 * BC, BC, BK)
    w3 = (dot(x30, y0, PRECISION) + dot(x31, y1, PRECISION)
          + dot(x32, y2, PRECISION) + dot(x33, y3, PRECISION))
    store_rows(w, w3, i_b, i_h, T, H, K, t0 + 3 * BC, BC, BK)
    # U = L^-1 (beta V)
    z0 = load_rows(v, i_b, i_h, T, H, V, t0, BC, BV) * b0[:, None]
    z1 = load_rows(v, i_b, i_h, T, H, V, t0 + BC, BC, BV) * b1[:, None]
    z2 = load_rows(v, i_b, i_h, T, H, V, t0 + 2 * BC, BC, BV) * b2[:, None]
    z3 = load_rows(v, i_b, i_h, T, H, V, t0 + 3 * BC, BC, BV) * b3[:, None]
    store_rows(u, dot(x00, z0, PRECISION), i_b, i_h, T, H, V, t0, BC, BV)
    u1 = dot(x10, z0, PRECISION) + dot(x11, z1, PRECISION)
    store_rows(u, u1, i_b, i_h, T, H, V, t0 + BC, BC, BV)
    u2 = (dot(x20, z0, PRECISION) + dot(x21, z1, PRECISION)
          + dot(x22, z2, PRECISION))
    store_rows(u, u2, i_b, i_h, T, H, V, t0 + 2 * BC, BC, BV)
    u3 = (dot(x30, z0, PRECISION) + dot(x31, z1, PRECISION)
          + dot(x32, z2, PRECISION) + dot(x33, z3, PRECISION))
    store_rows(u, u3, i_b, i_h, T, H, V, t0 + 3 * BC, BC, BV)
    pG = gcum + (i_b * T) * H + i_h
    tl.store(pG + rows0 * H, G0, mask=m0)
    tl.store(pG + rows1 * H, G1, mask=m1)
    tl.store(pG + rows2 * H, G2, mask=m2)
    tl.store(pG + rows3 * H, G3, mask=m3)
    # the full (BT, BT) L^-1 for the backward, upper blocks zero
    p_l = linv + (i_bh * NT + i_t) * BT * BT + idx[:, None] * BT + idx[None, :]
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


@triton.jit
def _fwd_kernel(k, w, u, gcum, h, d, h0, ht, T, H, K: tl.constexpr, V: tl.constexpr,
                BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, USE_H0: tl.constexpr,
                STORE_HT: tl.constexpr, PRECISION: tl.constexpr):
    # the sequential part only: the state entering each chunk and the deltas D; the outputs are
    # computed afterwards, all chunks in parallel, by `_output_kernel`
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    NT = tl.cdiv(T, BT)
    idx = tl.arange(0, BT)
    b_s = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        p_h0 = tl.make_block_ptr(h0 + i_bh * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
        b_s += tl.load(p_h0, boundary_check=(0, 1)).to(tl.float32)
    for i_t in range(NT):
        rows = i_t * BT + idx
        valid = rows < T
        p_h = tl.make_block_ptr(h + (i_bh * NT + i_t) * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
        tl.store(p_h, rounded(b_s, p_h.dtype.element_ty), boundary_check=(0, 1))
        p_k = tl.make_block_ptr(k + (i_b * T * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, 0), (BT, BK), (1, 0))
        p_w = tl.make_block_ptr(w + (i_b * T * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, 0), (BT, BK), (1, 0))
        p_u = tl.make_block_ptr(u + (i_b * T * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
        p_d = tl.make_block_ptr(d + (i_b * T * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
        b_k = tl.load(p_k, boundary_check=(0, 1)).to(tl.float32)
        b_w = tl.load(p_w, boundary_check=(0, 1))
        b_u = tl.load(p_u, boundary_check=(0, 1))
        b_G = tl.load(gcum + (i_b * T + rows) * H + i_h, mask=valid, other=0.)
        last = tl.minimum(T - i_t * BT, BT) - 1
        G_last = tl.sum(tl.where(idx == last, b_G, 0.))
        b_d = b_u - dot(b_w, b_s, PRECISION)
        tl.store(p_d, rounded(b_d, p_d.dtype.element_ty), boundary_check=(0, 1))
        k_decay = tl.where(valid, tl.exp(G_last - b_G), 0.)
        b_s = b_s * tl.exp(G_last) + dot(tl.trans(b_k * k_decay[:, None]), b_d, PRECISION)
    if STORE_HT:
        p_ht = tl.make_block_ptr(ht + i_bh * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
        tl.store(p_ht, b_s, boundary_check=(0, 1))


@triton.jit
def _output_kernel(q, k, gcum, h, d, o, scale, T, H, K: tl.constexpr, V: tl.constexpr,
                   BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr):
    # O = scale [exp(G) Q S0 + (causal exp(G_i - G_j) Q K^T) D], every chunk in parallel
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    NT = tl.cdiv(T, BT)
    idx = tl.arange(0, BT)
    rows = i_t * BT + idx
    valid = rows < T
    causal = (idx[:, None] >= idx[None, :]) & valid[:, None]
    p_q = tl.make_block_ptr(q + (i_b * T * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, 0), (BT, BK), (1, 0))
    p_k = tl.make_block_ptr(k + (i_b * T * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, 0), (BT, BK), (1, 0))
    p_h = tl.make_block_ptr(h + (i_bh * NT + i_t) * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
    p_d = tl.make_block_ptr(d + (i_b * T * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
    p_o = tl.make_block_ptr(o + (i_b * T * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
    # under torch.compile the Python float `scale` arrives as fp64: keep q in fp32
    b_q = (tl.load(p_q, boundary_check=(0, 1)).to(tl.float32) * scale).to(tl.float32)
    b_k = tl.load(p_k, boundary_check=(0, 1)).to(tl.float32)
    b_G = tl.load(gcum + (i_b * T + rows) * H + i_h, mask=valid, other=0.)
    b_s = tl.load(p_h, boundary_check=(0, 1))
    b_d = tl.load(p_d, boundary_check=(0, 1))
    qk = dot(b_q, tl.trans(b_k), PRECISION)
    qk = qk * tl.where(causal, tl.exp(b_G[:, None] - b_G[None, :]), 0.)
    b_o = dot(b_q * tl.exp(b_G)[:, None], b_s, PRECISION)
    b_o += dot(qk, b_d, PRECISION)
    tl.store(p_o, rounded(b_o, p_o.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def _bwd_local_kernel(q, k, gcum, do, dd, dh, scale, T, H, K: tl.constexpr, V: tl.constexpr,
                      BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr):
    # the parts of dD and of the state gradient that need no later chunk, every chunk in
    # parallel: dD = (causal exp(G_i - G_j) Q K^T)^T dO into dd, (exp(G) Q)^T dO into dh;
    # `_bwd_state_kernel` adds the terms that flow back from later chunks
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    NT = tl.cdiv(T, BT)
    idx = tl.arange(0, BT)
    rows = i_t * BT + idx
    valid = rows < T
    causal = (idx[:, None] >= idx[None, :]) & valid[:, None]
    p_q = tl.make_block_ptr(q + (i_b * T * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, 0), (BT, BK), (1, 0))
    p_k = tl.make_block_ptr(k + (i_b * T * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, 0), (BT, BK), (1, 0))
    p_do = tl.make_block_ptr(do + (i_b * T * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
    p_dd = tl.make_block_ptr(dd + (i_b * T * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
    p_dh = tl.make_block_ptr(dh + (i_bh * NT + i_t) * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
    b_q = (tl.load(p_q, boundary_check=(0, 1)).to(tl.float32) * scale).to(tl.float32)
    b_k = tl.load(p_k, boundary_check=(0, 1)).to(tl.float32)
    b_do = tl.load(p_do, boundary_check=(0, 1)).to(tl.float32)
    b_G = tl.load(gcum + (i_b * T + rows) * H + i_h, mask=valid, other=0.)
    qk = dot(b_q, tl.trans(b_k), PRECISION)
    qk = qk * tl.where(causal, tl.exp(b_G[:, None] - b_G[None, :]), 0.)
    tl.store(p_dd, dot(tl.trans(qk), b_do, PRECISION), boundary_check=(0, 1))
    b_qg = b_q * tl.where(valid, tl.exp(b_G), 0.)[:, None]
    tl.store(p_dh, dot(tl.trans(b_qg), b_do, PRECISION), boundary_check=(0, 1))


@triton.jit
def _bwd_state_kernel(k, w, gcum, dd, dh, dht, dh0, T, H, K: tl.constexpr, V: tl.constexpr,
                      BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, USE_DHT: tl.constexpr,
                      STORE_DH0: tl.constexpr, PRECISION: tl.constexpr):
    # backwards over the chunks: dD += (exp(G_last - G) K) dS, and the gradient of the state
    # entering the chunk, dS <- exp(G_last) dS + (exp(G) Q)^T dO - W^T dD
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    NT = tl.cdiv(T, BT)
    idx = tl.arange(0, BT)
    # (BK, BV): gradient of the state leaving the current chunk
    b_ds = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        p_dht = tl.make_block_ptr(dht + i_bh * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
        b_ds += tl.load(p_dht, boundary_check=(0, 1)).to(tl.float32)
    for j in range(NT):
        i_t = NT - 1 - j
        rows = i_t * BT + idx
        valid = rows < T
        p_dh = tl.make_block_ptr(dh + (i_bh * NT + i_t) * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
        p_k = tl.make_block_ptr(k + (i_b * T * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, 0), (BT, BK), (1, 0))
        p_w = tl.make_block_ptr(w + (i_b * T * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, 0), (BT, BK), (1, 0))
        p_dd = tl.make_block_ptr(dd + (i_b * T * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
        # (BK, BV): the chunk's own (exp(G) Q)^T dO, replaced below by the gradient of its end state
        b_local = tl.load(p_dh, boundary_check=(0, 1))
        tl.store(p_dh, b_ds, boundary_check=(0, 1))
        b_k = tl.load(p_k, boundary_check=(0, 1)).to(tl.float32)
        b_w = tl.load(p_w, boundary_check=(0, 1))
        b_G = tl.load(gcum + (i_b * T + rows) * H + i_h, mask=valid, other=0.)
        last = tl.minimum(T - i_t * BT, BT) - 1
        G_last = tl.sum(tl.where(idx == last, b_G, 0.))
        k_decay = tl.where(valid, tl.exp(G_last - b_G), 0.)
        b_dd = tl.load(p_dd, boundary_check=(0, 1))
        b_dd += dot(b_k * k_decay[:, None], b_ds, PRECISION)
        tl.store(p_dd, b_dd, boundary_check=(0, 1))
        b_ds = b_ds * tl.exp(G_last) + b_local - dot(tl.trans(b_w), b_dd, PRECISION)
    if STORE_DH0:
        p_dh0 = tl.make_block_ptr(dh0 + i_bh * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
        tl.store(p_dh0, b_ds, boundary_check=(0, 1))


@triton.jit
def _bwd_chunk_kernel(q, k, v, beta, w, u, d, dd, gcum, linv, h, dh, do, dq, dk, dv, dbeta, dg,
                      scale, T, H, K: tl.constexpr, V: tl.constexpr,
                      BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr):
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    NT = tl.cdiv(T, BT)
    idx = tl.arange(0, BT)
    rows = i_t * BT + idx
    valid = rows < T
    # rows past the end of the sequence are masked out: their G is 0, so exp(G_i - G_j) can overflow
    strict = (idx[:, None] > idx[None, :]) & valid[:, None]
    causal = (idx[:, None] >= idx[None, :]) & valid[:, None]
    p_q = tl.make_block_ptr(q + (i_b * T * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, 0), (BT, BK), (1, 0))
    p_k = tl.make_block_ptr(k + (i_b * T * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, 0), (BT, BK), (1, 0))
    b_q = (tl.load(p_q, boundary_check=(0, 1)).to(tl.float32) * scale).to(tl.float32)
    b_k = tl.load(p_k, boundary_check=(0, 1)).to(tl.float32)
    b_beta = tl.load(beta + (i_b * T + rows) * H + i_h, mask=valid, other=0.).to(tl.float32)
    b_G = tl.load(gcum + (i_b * T + rows) * H + i_h, mask=valid, other=0.)
    b_linv = tl.load(linv + (i_bh * NT + i_t) * BT * BT + idx[:, None] * BT + idx[None, :])
    last = tl.minimum(T - i_t * BT, BT) - 1
    G_last = tl.sum(tl.where(idx == last, b_G, 0.))
    e_G = tl.exp(b_G)
    k_decay = tl.where(valid, tl.exp(G_last - b_G), 0.)
    b_dq = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    b_dw = tl.zeros([BT, BK], dtype=tl.float32)
    # (BT, BT): dO D^T, and the gradient of L (before the sign and the strict-lower mask)
    b_r = tl.zeros([BT, BT], dtype=tl.float32)
    b_da = tl.zeros([BT, BT], dtype=tl.float32)
    b_dbeta = tl.zeros([BT], dtype=tl.float32)
    b_dG = tl.zeros([BT], dtype=tl.float32)
    dG_last = 0.
    for i_v in range(tl.cdiv(V, BV)):
        p_h = tl.make_block_ptr(h + (i_bh * NT + i_t) * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
        p_dh = tl.make_block_ptr(dh + (i_bh * NT + i_t) * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
        tv = (i_b * T * H + i_h) * V
        p_v = tl.make_block_ptr(v + tv, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
        p_u = tl.make_block_ptr(u + tv, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
        p_d = tl.make_block_ptr(d + tv, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
        p_dd = tl.make_block_ptr(dd + tv, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
        p_do = tl.make_block_ptr(do + tv, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
        p_dv = tl.make_block_ptr(dv + tv, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
        b_h = tl.load(p_h, boundary_check=(0, 1))
        b_dh = tl.load(p_dh, boundary_check=(0, 1))
        b_v = tl.load(p_v, boundary_check=(0, 1)).to(tl.float32)
        b_u = tl.load(p_u, boundary_check=(0, 1))
        b_d = tl.load(p_d, boundary_check=(0, 1))
        b_dd = tl.load(p_dd, boundary_check=(0, 1))
        b_do = tl.load(p_do, boundary_check=(0, 1)).to(tl.float32)
        # output through the entering state: O += exp(G) Q S0
        dq_state = e_G[:, None] * dot(b_do, tl.trans(b_h), PRECISION)
        b_dq += dq_state
        b_dG += tl.sum(b_q * dq_state, axis=1)
        b_r += dot(b_do, tl.trans(b_d), PRECISION)
        # leaving state: S_BT += (exp(G_last - G) K)^T D
        dk_state = k_decay[:, None] * dot(b_d, tl.trans(b_dh), PRECISION)
        b_dk += dk_state
        sk = tl.sum(b_k * dk_state, axis=1)
        b_dG -= sk
        dG_last += tl.sum(sk) + tl.exp(G_last) * tl.sum(b_h * b_dh)
        # D = U - W S0 with U = L^-1 (beta V)
        b_dw -= dot(b_dd, tl.trans(b_h), PRECISION)
        b_dyv = dot(tl.trans(b_linv), b_dd, PRECISION)
        tl.store(p_dv, rounded(b_dyv * b_beta[:, None], p_dv.dtype.element_ty), boundary_check=(0, 1))
        b_dbeta += tl.sum(b_dyv * b_v, axis=1)
        b_da += dot(b_dyv, tl.trans(b_u), PRECISION)
    p_w = tl.make_block_ptr(w + (i_b * T * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, 0), (BT, BK), (1, 0))
    b_w = tl.load(p_w, boundary_check=(0, 1))
    # W = L^-1 (beta exp(G) K)
    b_dyk = dot(tl.trans(b_linv), b_dw, PRECISION)
    b_dk += b_dyk * (b_beta * e_G)[:, None]
    dyk_k = tl.sum(b_dyk * b_k, axis=1)
    b_dbeta += dyk_k * e_G
    b_dG += dyk_k * b_beta * e_G
    b_da += dot(b_dyk, tl.trans(b_w), PRECISION)
    # A_ij = beta_i k_i.k_j exp(G_i - G_j), strictly lower
    b_da = tl.where(strict, -b_da, 0.)
    gamma = tl.where(strict, tl.exp(b_G[:, None] - b_G[None, :]), 0.)
    kk = dot(b_k, tl.trans(b_k), PRECISION)
    da_kk = b_da * kk * gamma
    b_dbeta += tl.sum(da_kk, axis=1)
    p_a = da_kk * b_beta[:, None]
    b_dG += tl.sum(p_a, axis=1) - tl.sum(p_a, axis=0)
    dkk = b_da * b_beta[:, None] * gamma
    b_dk += dot(dkk, b_k, PRECISION)
    b_dk += dot(tl.trans(dkk), b_k, PRECISION)
    # in-chunk scores: O += (causal exp(G_i - G_j) Q K^T) D
    b_ds = b_r * tl.where(causal, tl.exp(b_G[:, None] - b_G[None, :]), 0.)
    b_dq += dot(b_ds, b_k, PRECISION)
    b_dk += dot(tl.trans(b_ds), b_q, PRECISION)
    p_s = b_ds * dot(b_q, tl.trans(b_k), PRECISION)
    b_dG += tl.sum(p_s, axis=1) - tl.sum(p_s, axis=0)
    b_dG += tl.where(idx == last, dG_last, 0.)
    b_dG = tl.where(valid, b_dG, 0.)
    # G is a cumulative sum of g inside the chunk: dg_j = sum_{i >= j} dG_i
    b_dg = tl.sum(b_dG) - tl.cumsum(b_dG, axis=0) + b_dG
    p_dq = tl.make_block_ptr(dq + (i_b * T * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, 0), (BT, BK), (1, 0))
    p_dk = tl.make_block_ptr(dk + (i_b * T * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, 0), (BT, BK), (1, 0))
    tl.store(p_dq, rounded(b_dq * scale, p_dq.dtype.element_ty), boundary_check=(0, 1))
    tl.store(p_dk, rounded(b_dk, p_dk.dtype.element_ty), boundary_check=(0, 1))
    tl.store(dbeta + (i_b * T + rows) * H + i_h, rounded(b_dbeta, dbeta.dtype.element_ty), mask=valid)
    tl.store(dg + (i_b * T + rows) * H + i_h, rounded(b_dg, dg.dtype.element_ty), mask=valid)


def _value_block(K: int, V: int) -> int:
    # narrow value blocks: more programs in the sequential kernels, and the (BK, BV) state plus
    # the (BT, BK) tiles still (mostly) fit in registers. Never 16, even for V <= 16 (masked):
    # 16-wide blocks crashed with an illegal memory access on an H100 and an H200 (Triton 3.6)
    return 32


def _prep_launch_options(K: int) -> dict:
    # its products are 16 x 16 blocks, too small to share among 8 warps: 2 warps took the forward
    # from 0.55 to 0.41 ms at 8,2048,8,128 and from 0.46 to 0.25 ms at 8,2048,12,64 (H100,
    # gpu/sweep_launch.py prep)
    return {"num_warps": 2, "num_stages": 1 if K > 64 else 2}


def _output_launch_options(K: int) -> dict:
    # 4 warps: forward 0.33 against 0.41 ms at 8,2048,8,128, 0.22 against 0.24 at 8,2048,12,64
    return {"num_warps": 4, "num_stages": 1}


def _bwd_local_launch_options(K: int) -> dict:
    # 4 warps: fwd+bwd 1.95 against 2.04 ms at 8,2048,8,128, 1.08 against 1.12 at 8,2048,12,64
    # (H100, gpu/sweep_launch.py output / bwd_local)
    return {"num_warps": 4, "num_stages": 1}


def _bwd_chunk_value_block(K: int, V: int) -> int:
    # the value columns `_bwd_chunk_kernel` takes per step of its loop over V: all 64 of a
    # 64-wide head at once (same sweep); at K = 128, 64 was slower than 32 (2.10-2.39 against 1.89)
    return 64 if K <= 64 and V >= 64 else _value_block(K, V)


def _sequential_launch_options(K: int, precision: str) -> dict:
    # the kernels that walk the chunks one after another carry only the (BK, BV) state from one
    # chunk to the next, so the next chunk's tiles can be loaded while the current one is used:
    # 3 stages and 4 warps took 2.28 against 2.46 ms fwd+bwd at 8,2048,8,128 and 1.70 against 1.75
    # at 8,2048,16,64 (H100, gpu/sweep_launch.py sequential). float32 tiles (float32 and float16
    # inputs) of keys wider than 64 are twice those bytes: with 3 stages `_bwd_state` asked for
    # 246,784 bytes of shared memory where a Hopper block may have 232,448 and failed to launch
    # (tests/kernels/test_kernels_shared_memory.py compiles every kernel for sm_90 on the CPU)
    if K > 64 and precision != "bf16":
        return {"num_warps": 8, "num_stages": 1}
    return {"num_warps": 4, "num_stages": 3}


def _bwd_chunk_launch_options(K: int) -> dict:
    # two pipeline stages fit with bfloat16 tiles also at K = 128: 2.19 against 2.29 ms fwd+bwd at
    # 8,2048,8,128 (H100, gpu/sweep_launch.py bwd_chunk); 16 warps were slower (3.5 ms) and
    # crashed at K = 64 with an illegal memory access, like the 16-wide value blocks. At K <= 64,
    # with the value block below, 4 warps: 0.89 against 1.07 ms at 8,2048,12,64. With float32
    # tiles at K = 128 the two stages take 229,376 of the 232,448 bytes a Hopper block may have
    return {"num_warps": 8 if K > 64 else 4, "num_stages": 2}


def _delta_rule_fwd(q, k, v, beta, g, scale, initial_state, output_final_state):
    B, T, H, K = q.shape
    V = v.shape[-1]
    BT, BK, BV = CHUNK, block_size(K), block_size(V)
    NT = triton.cdiv(T, BT)
    dev, f32 = q.device, torch.float32
    precision = dot_precision(q.dtype, K)
    inverse_precision = "tf32" if precision == "bf16" else precision
    # W, U, D, the chunk states and L^-1 reach the later kernels only as `dot` operands
    mid = intermediate_dtype(precision)
    w, u = nan_buffer((B, T, H, K), mid, dev), nan_buffer((B, T, H, V), mid, dev)
    gcum = nan_buffer((B, T, H), f32, dev)
    linv = nan_buffer((B * H, NT, BT, BT), mid, dev)
    _prep_fwd_kernel[(NT, B * H)](k, v, beta, g, w, u, gcum, linv, T, H, K, V, BT, BK, BV,
                                  precision, inverse_precision, INVERSE_BY_SQUARING,
                                  **_prep_launch_options(K))
    BV = _value_block(K, V)
    h = nan_buffer((B * H, NT, K, V), mid, dev)
    d = nan_buffer((B, T, H, V), mid, dev)
    o = nan_buffer((B, T, H, V), v.dtype, dev)
    ht = nan_buffer((B, H, K, V), f32, dev) if output_final_state else None
    _fwd_kernel[(triton.cdiv(V, BV), B * H)](
        k, w, u, gcum, h, d, initial_state, ht, T, H, K, V, BT, BK, BV,
        initial_state is not None, output_final_state, precision,
        **_sequential_launch_options(K, precision))
    _output_kernel[(triton.cdiv(V, BV), NT, B * H)](
        q, k, gcum, h, d, o, scale, T, H, K, V, BT, BK, BV, precision, **_output_launch_options(K))
    return o, ht, (w, u, d, gcum, linv, h)


def _delta_rule_bwd(q, k, v, beta, scale, initial_state, saved, do, dht):
    w, u, d, gcum, linv, h = saved
    B, T, H, K = q.shape
    V = v.shape[-1]
    BT, BK, BV = CHUNK, block_size(K), _value_block(K, V)
    NT = triton.cdiv(T, BT)
    dev, f32 = q.device, torch.float32
    precision = dot_precision(q.dtype, K)
    dd = nan_buffer((B, T, H, V), f32, dev)
    dh = nan_buffer((B * H, NT, K, V), f32, dev)
    dh0 = nan_buffer((B, H, K, V), f32, dev) if initial_state is not None else None
    _bwd_local_kernel[(triton.cdiv(V, BV), NT, B * H)](
        q, k, gcum, do, dd, dh, scale, T, H, K, V, BT, BK, BV, precision,
        **_bwd_local_launch_options(K))
    _bwd_state_kernel[(triton.cdiv(V, BV), B * H)](
        k, w, gcum, dd, dh, dht, dh0, T, H, K, V, BT, BK, BV,
        dht is not None, dh0 is not None, precision,
        **_sequential_launch_options(K, precision))
    dq, dk = nan_buffer(q.shape, q.dtype, dev), nan_buffer(k.shape, k.dtype, dev)
    dv = nan_buffer(v.shape, v.dtype, dev)
    dbeta, dg = nan_buffer(beta.shape, beta.dtype, dev), nan_buffer(beta.shape, f32, dev)
    _bwd_chunk_kernel[(NT, B * H)](
        q, k, v, beta, w, u, d, dd, gcum, linv, h, dh, do, dq, dk, dv, dbeta, dg, scale,
        T, H, K, V, BT, BK, _bwd_chunk_value_block(K, V), precision, **_bwd_chunk_launch_options(K))
    return dq, dk, dv, dbeta, dg, dh0


class ChunkDeltaRuleFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, beta, g, scale, initial_state, output_final_state):
        o, ht, saved = _delta_rule_fwd(q, k, v, beta, g, scale, initial_state, output_final_state)
        ctx.save_for_backward(q, k, v, beta, initial_state, *saved)
        ctx.scale, ctx.g_dtype = scale, g.dtype
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, beta, initial_state, *saved = ctx.saved_tensors
        dq, dk, dv, dbeta, dg, dh0 = _delta_rule_bwd(
            q, k, v, beta, ctx.scale, initial_state, saved, do.contiguous(),
            None if dht is None else dht.contiguous())
        return dq, dk, dv, dbeta, dg.to(ctx.g_dtype), None, dh0, None


def chunk_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(Gated) delta rule, chunked, in Triton; differentiable in q, k, v, beta, g, initial_state.

    Per token: S = S * exp(g); S = S + beta k (v - S^T k)^T; o = S^T (scale q).
    Same function as `ltm.ops.delta_rule.naive.naive_delta_rule`, which it is tested against.

    Args:
        q, k: [B, T, H, K]; v: [B, T, H, V]; all float32, bfloat16 or float16 (one dtype),
            K, V <= 128. Any T >= 1.
        beta: [B, T, H], the same dtype. g: [B, T, H] log decay (<= 0), any float dtype, or None.
        scale: multiplies q, defaults to K ** -0.5.
        initial_state: [B, H, K, V] (any float dtype, used in float32) or None for zeros.
    Returns:
        o: [B, T, H, V] in the dtype of v; the final state [B, H, K, V] in float32 when
        `output_final_state`, else None. The running state is float32; bfloat16 inputs with
        K >= 64 are multiplied in bfloat16 tiles with float32 sums, and the per-chunk states and
        other intermediates saved for the output and the backward are then bfloat16
        (`ltm.kernels.common.dot_precision` gives the measured errors).
    """
    if q.dim() != 4:
        raise ValueError(f"q must be [B, T, H, K], got shape {tuple(q.shape)}")
    B, T, H, K = q.shape
    check_btd("k", k, (B, T, H), "K")
    check_btd("v", v, (B, T, H), "V")
    if k.shape[-1] != K:
        raise ValueError(f"k must be [B, T, H, K] = {tuple(q.shape)} like q, got {tuple(k.shape)}")
    for name, x in (("q", q), ("k", k), ("v", v), ("beta", beta)):
        check_dtype(name, x, q.dtype)
    if tuple(beta.shape) != (B, T, H):
        raise ValueError(f"beta must be [B, T, H] = {(B, T, H)}, got {tuple(beta.shape)}")
    if g is not None and tuple(g.shape) != (B, T, H):
        raise ValueError(f"g must be [B, T, H] = {(B, T, H)} or None, got {tuple(g.shape)}")
    check_head_dim("q/k", K)
    check_head_dim("v", v.shape[-1])
    check_state("initial_state", initial_state, (B, H, K, v.shape[-1]))
    if T == 0:
        raise ValueError("q must hold at least one token (T >= 1)")
    scale = K ** -0.5 if scale is None else float(scale)
    g_in = torch.zeros_like(beta, dtype=torch.float32) if g is None else g.contiguous()
    h0 = None if initial_state is None else initial_state.float().contiguous()
    o, ht = ChunkDeltaRuleFunction.apply(q.contiguous(), k.contiguous(), v.contiguous(),
                                         beta.contiguous(), g_in, scale, h0, output_final_state)
    return o, ht
