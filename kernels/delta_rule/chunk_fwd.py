"""Forward kernels of the chunked (gated) delta rule; `chunk.py` launches them and gives the maths.

`_prep_fwd_kernel` (chunk-parallel; `_prep_chunk` per chunk, on looping programs with bf16 tiles):
the in-chunk cumulative log decay G, L^-1 block by block,
W = L^-1 (beta exp(G) K) and U = L^-1 (beta V). `_fwd_kernel` (sequential over chunks): the state
entering each chunk and the applied deltas D = U - W S0. `_output_kernel` (chunk-parallel): O.
With segments (launch_choices.py): `_fwd_kernel` per segment in parallel (end states from zeros and
transition matrices), `_segment_states_kernel` (sequential over segments), `_fwd_kernel` again.
`_fwd_overlapped_kernel`: `_fwd_kernel`'s and `_output_kernel`'s work (`_state_pass`, `_output_tile`)
in one launch, the outputs of each group of chunks computed while the state pass goes on.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ltm.kernels.common import (dot, invert_unit_lower, invert_unit_lower_by_squaring, load_rows, load_tile,
                                rounded, seq_tile, seq_tile_t, state_tile, store_rows, store_tile)


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
def _prep_fwd_kernel(k, v, beta, g, w, u, gcum, linv, T, H, HQ, K: tl.constexpr,
                     V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                     PRECISION: tl.constexpr, INV_PRECISION: tl.constexpr, SQUARING: tl.constexpr,
                     STORE_LINV: tl.constexpr, JOBS, PERSISTENT: tl.constexpr):
    # PERSISTENT: grid (P,), program p takes chunks p, p + P, ... of the JOBS = NT B H (chunk
    # i_bh NT + i_t), so that Triton loads the next chunk's beta and decays while this one is
    # worked (num_stages; launch_choices.PREP_PROGRAMS_PER_SM); otherwise grid (NT, B H), one
    # chunk per program
    if PERSISTENT:
        NT = tl.cdiv(T, BT)
        for job in range(tl.program_id(0), JOBS, tl.num_programs(0)):
            _prep_chunk(k, v, beta, g, w, u, gcum, linv, job % NT, job // NT, T, H, HQ, K, V, BT, BK,
                        BV, PRECISION, INV_PRECISION, SQUARING, STORE_LINV)
    else:
        _prep_chunk(k, v, beta, g, w, u, gcum, linv, tl.program_id(0), tl.program_id(1), T, H, HQ, K,
                    V, BT, BK, BV, PRECISION, INV_PRECISION, SQUARING, STORE_LINV)


@triton.jit
def _prep_chunk(k, v, beta, g, w, u, gcum, linv, i_t, i_bh, T, H, HQ, K: tl.constexpr,
                V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                PRECISION: tl.constexpr, INV_PRECISION: tl.constexpr, SQUARING: tl.constexpr,
                STORE_LINV: tl.constexpr):
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
    sw0, sw1, sw2, sw3 = b0 * tl.exp(G0), b1 * tl.exp(G1), b2 * tl.exp(G2), b3 * tl.exp(G3)
    _lower_times(x00, x10, x11, x20, x21, x22, x30, x31, x32, x33, k, w, sw0, sw1, sw2, sw3, i_b, i_hq,
                 i_h, T, H, HQ, K, t0, BC, BK, PRECISION)
    _lower_times(x00, x10, x11, x20, x21, x22, x30, x31, x32, x33, v, u, b0, b1, b2, b3, i_b, i_hq, i_h,
                 T, H, HQ, V, t0, BC, BV, PRECISION)
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
    # rows), row block by row block: src read from head i_hq of HQ, dst written to head i_h of H
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


@triton.jit
def _fwd_kernel(k, w, u, gcum, h, d, h0, ht, q, o, scale, T, H, HQ, SEG, K: tl.constexpr,
                V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                USE_H0: tl.constexpr, STORE_HT: tl.constexpr, STORE_HD: tl.constexpr,
                SEGMENTED: tl.constexpr, TRANSITION: tl.constexpr, FUSE_O: tl.constexpr,
                PRECISION: tl.constexpr):
    # the sequential part only: the state entering each chunk and the deltas D; the outputs are
    # computed afterwards, all chunks in parallel, by `_output_kernel`. SEGMENTED: program
    # (i_v, i_bh, i_s) walks segment i_s, chunks i_s SEG .. (i_s + 1) SEG - 1, from h0[i_bh NS +
    # i_s] (or zeros) to its end state in ht[i_bh NS + i_s]; otherwise (the default, compiled as
    # before segments existed) program (i_v, i_bh) walks the whole sequence from h0[i_bh].
    # TRANSITION: U taken as 0 and the state started from the identity (V = K), so that the end
    # state is the segment's transition matrix (launch_choices.py, "Segments").
    # FUSE_O: the outputs too, chunk by chunk as the state passes (`_output_kernel`'s maths), so a
    # forward without a backward neither writes nor reads the per-chunk states and D (STORE_HD off)
    _state_pass(k, w, u, gcum, h, d, h0, ht, q, o, scale, None, tl.program_id(0), tl.program_id(1),
                T, H, HQ, SEG, K, V, BT, BK, BV, USE_H0, STORE_HT, STORE_HD, SEGMENTED, TRANSITION,
                FUSE_O, 0, 1, PRECISION)


@triton.jit
def _state_pass(k, w, u, gcum, h, d, h0, ht, q, o, scale, ready, i_v, i_bh, T, H, HQ, SEG,
                K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                USE_H0: tl.constexpr, STORE_HT: tl.constexpr, STORE_HD: tl.constexpr,
                SEGMENTED: tl.constexpr, TRANSITION: tl.constexpr, FUSE_O: tl.constexpr,
                SIGNAL: tl.constexpr, EVERY: tl.constexpr, PRECISION: tl.constexpr):
    # `_fwd_kernel`'s work for value block i_v of state i_bh. SIGNAL > 0 (the program's threads):
    # once the states and D of a group of EVERY chunks are stored, add SIGNAL to the group's count
    # (`_group_count`, `_fwd_overlapped_kernel`)
    i_b, i_h = i_bh // H, i_bh % H
    i_hq = i_h % HQ  # the head of q, k, v this state reads
    NT = tl.cdiv(T, BT)
    if SEGMENTED:
        i_s, NS = tl.program_id(2), tl.num_programs(2)
        t_first, t_end = i_s * SEG, tl.minimum(NT, i_s * SEG + SEG)
    else:
        i_s, NS, t_first, t_end = 0, 1, 0, NT
    idx = tl.arange(0, BT)
    b_s = tl.zeros([BK, BV], dtype=tl.float32)
    if TRANSITION:
        eye = tl.arange(0, BK)[:, None] == (i_v * BV + tl.arange(0, BV))[None, :]
        b_s += tl.where(eye, 1., 0.)
    elif USE_H0:
        p_h0 = state_tile(h0, i_bh * NS + i_s, K, V, i_v * BV, BK, BV)
        b_s += load_tile(p_h0).to(tl.float32)
    for i_t in range(t_first, t_end):
        rows = i_t * BT + idx
        valid = rows < T
        if STORE_HD:
            p_h = state_tile(h, i_bh * NT + i_t, K, V, i_v * BV, BK, BV)
            store_tile(p_h, b_s)
        # K^T as stored (BK, BT) and the decay on D's rows, not K's: (exp(G_last - G) K)^T D =
        # K^T (exp(G_last - G) D), a (BT, BV) scaling instead of (BT, BK) and no transpose in
        # registers; the step's latency is the kernel's time where B H is small (1,32768,4,128:
        # 512 steps, 2 us each, against fla's 1 us; H100)
        p_kt = seq_tile_t(k, i_b, i_hq, T, HQ, K, i_t * BT, 0, BT, BK)
        p_w = seq_tile(w, i_b, i_h, T, H, K, i_t * BT, 0, BT, BK)
        # (the pointers in this order: the one-segment pass compiles as before segments existed)
        if not TRANSITION:
            p_u = seq_tile(u, i_b, i_h, T, H, V, i_t * BT, i_v * BV, BT, BV)
        if STORE_HD:
            p_d = seq_tile(d, i_b, i_h, T, H, V, i_t * BT, i_v * BV, BT, BV)
        b_kt = load_tile(p_kt)
        b_w = load_tile(p_w)
        if TRANSITION:
            b_u = tl.zeros([BT, BV], dtype=tl.float32)
        else:
            b_u = load_tile(p_u)
        b_G = tl.load(gcum + (i_b * T + rows) * H + i_h, mask=valid, other=0.)
        last = tl.minimum(T - i_t * BT, BT) - 1
        G_last = tl.sum(tl.where(idx == last, b_G, 0.))
        b_d = b_u - dot(b_w, b_s, PRECISION)
        if STORE_HD:
            store_tile(p_d, b_d)
        if SIGNAL > 0:
            # each of the SIGNAL lanes (one per thread) releases its own stores of the group, so
            # the count reaches SIGNAL per value block; one release by one thread after a barrier
            # would need the barrier, which stops Triton pipelining this loop's loads
            if (i_t % EVERY == EVERY - 1) | (i_t == t_end - 1):
                lanes = tl.arange(0, SIGNAL)
                tl.atomic_add(_group_count(ready, i_bh, i_t, NT, EVERY) + lanes * 0, 1, sem="release")
        if FUSE_O:
            _chunk_output(q, o, scale, b_kt, b_s, b_d, b_G, valid, i_b, i_h, i_hq, T, H, HQ, K, V,
                          i_t * BT, i_v * BV, BT, BK, BV, PRECISION)
        k_decay = tl.where(valid, tl.exp(G_last - b_G), 0.)
        b_s = b_s * tl.exp(G_last) + dot(b_kt, b_d * k_decay[:, None], PRECISION)
    if STORE_HT:
        p_ht = state_tile(ht, i_bh * NS + i_s, K, V, i_v * BV, BK, BV)
        store_tile(p_ht, b_s)


@triton.jit
def _group_count(ready, i_bh, i_t, NT, EVERY: tl.constexpr):
    # where `_fwd_overlapped_kernel` counts the releases of chunk i_t's group of EVERY chunks of
    # state i_bh (ready[0] holds the start tickets): one address for the releases and the waits
    return ready + 1 + i_bh * tl.cdiv(NT, EVERY) + i_t // EVERY


@triton.jit
def _chunk_output(q, o, scale, b_kt, b_s, b_d, b_G, valid, i_b, i_h, i_hq, T, H, HQ, K: tl.constexpr,
                  V: tl.constexpr, row0, col0, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  PRECISION: tl.constexpr):
    # one chunk's O[:, col0:col0 + BV] = scale [exp(G) Q S0 + (causal exp(G_i - G_j) Q K^T) D]
    # from the state entering it and its D, with the (BK, BT) K^T the state pass already holds
    # Q stays in its dtype and the scales go on the (BT, BT) and (BT, BV) products: a float32
    # (BT, BK) Q had the 4-warp state pass spill ~1.3 KB per thread (ptxas, sm_90, bf16, K = 128).
    # `scale` arrives as float64 under torch.compile: it meets only (BT,) vectors, made float32
    idx = tl.arange(0, BT)
    causal = (idx[:, None] >= idx[None, :]) & valid[:, None]
    row_scale = (tl.full([BT], 1., tl.float32) * scale).to(tl.float32)
    state_scale = (tl.exp(b_G) * scale).to(tl.float32)
    b_q = load_tile(seq_tile(q, i_b, i_hq, T, HQ, K, row0, 0, BT, BK))
    qk = dot(b_q, b_kt, PRECISION) * tl.where(causal, tl.exp(b_G[:, None] - b_G[None, :]), 0.)
    b_o = dot(qk, b_d, PRECISION) * row_scale[:, None]
    b_o += dot(b_q, b_s, PRECISION) * state_scale[:, None]
    store_tile(seq_tile(o, i_b, i_h, T, H, V, row0, col0, BT, BV), b_o)


@triton.jit
def _segment_states_kernel(p, e, h0, hs, ht, NS, K: tl.constexpr, V: tl.constexpr,
                           BK: tl.constexpr, BV: tl.constexpr, USE_H0: tl.constexpr,
                           STORE_HT: tl.constexpr, PRECISION: tl.constexpr):
    # sequential over the segments: S_{s+1} = P_s S_s + E_s from each segment's transition P_s
    # (K, K) and its end state from zeros E_s; the state entering segment s goes to hs[i_bh NS + s]
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    b_s = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        b_s += load_tile(state_tile(h0, i_bh, K, V, i_v * BV, BK, BV)).to(tl.float32)
    for i_s in range(NS):
        store_tile(state_tile(hs, i_bh * NS + i_s, K, V, i_v * BV, BK, BV), b_s)
        b_p = load_tile(state_tile(p, i_bh * NS + i_s, K, K, 0, BK, BK))
        b_e = load_tile(state_tile(e, i_bh * NS + i_s, K, V, i_v * BV, BK, BV))
        b_s = dot(b_p, b_s, PRECISION) + b_e
    if STORE_HT:
        store_tile(state_tile(ht, i_bh, K, V, i_v * BV, BK, BV), b_s)


@triton.jit
def _output_kernel(q, k, gcum, h, d, o, scale, T, H, HQ, K: tl.constexpr, V: tl.constexpr,
                   BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr):
    # O = scale [exp(G) Q S0 + (causal exp(G_i - G_j) Q K^T) D], every chunk in parallel
    _output_tile(q, k, gcum, h, d, o, scale, tl.program_id(0), tl.program_id(1), tl.program_id(2),
                 T, H, HQ, K, V, BT, BK, BV, PRECISION)


@triton.jit
def _output_tile(q, k, gcum, h, d, o, scale, i_v, i_t, i_bh, T, H, HQ, K: tl.constexpr,
                 V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                 PRECISION: tl.constexpr):
    # value block i_v of chunk i_t of state i_bh
    i_b, i_h = i_bh // H, i_bh % H
    i_hq = i_h % HQ  # the head of q, k, v this state reads
    NT = tl.cdiv(T, BT)
    idx = tl.arange(0, BT)
    rows = i_t * BT + idx
    valid = rows < T
    causal = (idx[:, None] >= idx[None, :]) & valid[:, None]
    p_q = seq_tile(q, i_b, i_hq, T, HQ, K, i_t * BT, 0, BT, BK)
    p_k = seq_tile(k, i_b, i_hq, T, HQ, K, i_t * BT, 0, BT, BK)
    p_h = state_tile(h, i_bh * NT + i_t, K, V, i_v * BV, BK, BV)
    p_d = seq_tile(d, i_b, i_h, T, H, V, i_t * BT, i_v * BV, BT, BV)
    p_o = seq_tile(o, i_b, i_h, T, H, V, i_t * BT, i_v * BV, BT, BV)
    # under torch.compile the Python float `scale` arrives as fp64: keep q in fp32
    b_q = (load_tile(p_q).to(tl.float32) * scale).to(tl.float32)
    b_k = load_tile(p_k).to(tl.float32)
    b_G = tl.load(gcum + (i_b * T + rows) * H + i_h, mask=valid, other=0.)
    b_s = load_tile(p_h)
    b_d = load_tile(p_d)
    qk = dot(b_q, tl.trans(b_k), PRECISION)
    qk = qk * tl.where(causal, tl.exp(b_G[:, None] - b_G[None, :]), 0.)
    b_o = dot(b_q * tl.exp(b_G)[:, None], b_s, PRECISION)
    b_o += dot(qk, b_d, PRECISION)
    store_tile(p_o, b_o)


@triton.jit
def _fwd_overlapped_kernel(k, w, u, gcum, h, d, h0, ht, q, o, scale, ready, T, H, HQ, BH,
                           K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                           BV: tl.constexpr, BVO: tl.constexpr, LANES: tl.constexpr, EVERY: tl.constexpr,
                           USE_H0: tl.constexpr, STORE_HT: tl.constexpr, PRECISION: tl.constexpr):
    # the state pass and the outputs in one launch, for shapes whose state pass leaves SMs idle:
    # the first cdiv(V, BV) BH programs to start walk the chunks (`_fwd_kernel`, SIGNAL on); the
    # rest each take one chunk (chunks in order), wait until all cdiv(V, BV) value blocks have
    # stored the states and D of the group of EVERY chunks it is in, and write its outputs
    # (`_output_tile`) while the state pass goes on. Roles go by a ticket
    # taken at start (ready[0], zeroed by the launcher), not by program id: a program that waits
    # has a later ticket than every state program, which has started and waits on nothing, so no
    # wait can stall the pass. LANES: 32 num_warps, so that every thread releases its own stores.
    # (Triton hands a scalar atomic's result to the warps through shared memory: the barriers after
    # each read keep a fast warp from reusing that memory before a slow one has read it, so every
    # warp sees one ticket and leaves the wait together; without them roles mixed within a program
    # on an H200 and the outputs came out wrong)
    ticket = tl.atomic_add(ready, 1)
    tl.debug_barrier()
    NV, NT = tl.cdiv(V, BV), tl.cdiv(T, BT)
    if ticket < NV * BH:
        _state_pass(k, w, u, gcum, h, d, h0, ht, q, o, scale, ready, ticket % NV, ticket // NV,
                    T, H, HQ, NT, K, V, BT, BK, BV, USE_H0, STORE_HT, True, False, False, False,
                    LANES, EVERY, PRECISION)
    else:
        NVO = tl.cdiv(V, BVO)
        job = ticket - NV * BH
        i_t, i_bh, i_v = job // (BH * NVO), (job // NVO) % BH, job % NVO
        flag = _group_count(ready, i_bh, i_t, NT, EVERY)
        while tl.atomic_add(flag, 0, sem="acquire") < NV * LANES:
            tl.debug_barrier()
        tl.debug_barrier()
        _output_tile(q, k, gcum, h, d, o, scale, i_v, i_t, i_bh, T, H, HQ, K, V, BT, BK, BVO,
                     PRECISION)

