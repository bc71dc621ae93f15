"""Backward kernels of the chunked (gated) delta rule; `chunk.py` launches them and gives the maths.

`_bwd_local_kernel` (chunk-parallel): the in-chunk parts of dD and of the state gradients, dq, the
    in-chunk score gradient dS and dG's share of the scores.
`_bwd_state_kernel` (sequential, backwards over chunks, or by segments: segment_choices.py): the
    rest of dD and of the state gradients.
`_bwd_chunk_kernel` (chunk-parallel): dk, dv, dbeta, dg.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ltm.kernels.common import (dot, load_tile, rounded, segments_decay_below, seq_tile, seq_tile_t,
                                state_tile, store_segment_state, store_tile)


@triton.jit
def _bwd_local_kernel(q, k, d, h, gcum, do, dd, dh, dq, ds, dg_local, scale, T, H, HQ,
                      K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                      BV: tl.constexpr, PRECISION: tl.constexpr):
    # what needs no later chunk, one program per chunk and head, looping over the value columns
    # (Q K^T once per chunk, not once per value block): dD = (causal exp(G_i - G_j) Q K^T)^T dO
    # into dd and (exp(G) Q)^T dO into dh (`_bwd_state_kernel` adds what flows back from later
    # chunks); all of dq, which reads only the saved D and states; the in-chunk score gradient
    # dS = (dO D^T) * causal decay into ds, for `_bwd_chunk_kernel`'s dk share dS^T Q; and the
    # shares of dG that come with dq into dg_local
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    i_hq = i_h % HQ  # the head of q, k, v this state reads
    NT = tl.cdiv(T, BT)
    idx = tl.arange(0, BT)
    rows = i_t * BT + idx
    valid = rows < T
    # rows past the end of the sequence are masked out: their G is 0, so exp(G_i - G_j) can overflow
    causal = (idx[:, None] >= idx[None, :]) & valid[:, None]
    b_q = load_tile(seq_tile(q, i_b, i_hq, T, HQ, K, i_t * BT, 0, BT, BK))
    b_k = load_tile(seq_tile(k, i_b, i_hq, T, HQ, K, i_t * BT, 0, BT, BK))
    b_G = tl.load(gcum + (i_b * T + rows) * H + i_h, mask=valid, other=0.)
    e_G = tl.where(valid, tl.exp(b_G), 0.)
    decay = tl.where(causal, tl.exp(b_G[:, None] - b_G[None, :]), 0.)
    # (BT, BT) scaled, decayed scores: only a `dot` operand below
    b_a = dot(b_q, tl.trans(b_k), PRECISION) * decay * scale
    b_dqs = tl.zeros([BT, BK], dtype=tl.float32)  # dO S0^T, summed over the value blocks
    b_r = tl.zeros([BT, BT], dtype=tl.float32)  # dO D^T
    for i_v in range(tl.cdiv(V, BV)):
        b_do = load_tile(seq_tile(do, i_b, i_h, T, H, V, i_t * BT, i_v * BV, BT, BV))
        store_tile(seq_tile(dd, i_b, i_h, T, H, V, i_t * BT, i_v * BV, BT, BV),
                   dot(tl.trans(b_a), b_do, PRECISION))
        # (exp(G) Q)^T dO as Q^T (exp(G) dO): the row scales on the (BT, BV) operand
        b_dog = b_do.to(tl.float32) * (e_G * scale)[:, None]
        store_tile(state_tile(dh, i_bh * NT + i_t, K, V, i_v * BV, BK, BV),
                   dot(tl.trans(b_q), b_dog, PRECISION))
        b_h = load_tile(state_tile(h, i_bh * NT + i_t, K, V, i_v * BV, BK, BV))
        b_d = load_tile(seq_tile(d, i_b, i_h, T, H, V, i_t * BT, i_v * BV, BT, BV))
        b_dqs += dot(b_do, tl.trans(b_h), PRECISION)
        b_r += dot(b_do, tl.trans(b_d), PRECISION)
    # output through the entering state, O += exp(G) Q S0, and in-chunk, O += (causal exp(G_i -
    # G_j) Q K^T) D; dG_i gets q_i.dq_i from both and -k_j.dk_j's share from the second
    dq_state = e_G[:, None] * b_dqs
    b_dG = tl.sum(b_q.to(tl.float32) * dq_state, axis=1) * scale
    b_ds = b_r * decay
    b_dq = dq_state + dot(b_ds, b_k, PRECISION)
    # dG's share of the scores, dS * (scale Q K^T) = (dO D^T) * b_a: b_a holds the decay and
    # the scale already, so no second Q K^T
    p_s = b_r * b_a
    b_dG += tl.sum(p_s, axis=1) - tl.sum(p_s, axis=0)
    store_tile(seq_tile(dq, i_b, i_h, T, H, K, i_t * BT, 0, BT, BK), b_dq * scale)
    ds_ptrs = ds + (i_bh * NT + i_t).to(tl.int64) * BT * BT + idx[:, None] * BT + idx[None, :]
    tl.store(ds_ptrs, rounded(b_ds, ds.dtype.element_ty))
    tl.store(dg_local + (i_b * T + rows) * H + i_h, b_dG, mask=valid)


@triton.jit
def _bwd_state_kernel(k, w, gcum, dd, dh_local, dh, dht, dh0, T, H, HQ, K: tl.constexpr, V: tl.constexpr,
                      BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, USE_DHT: tl.constexpr,
                      STORE_DH0: tl.constexpr, PRECISION: tl.constexpr, SEG,
                      SEGMENTED: tl.constexpr, MODE: tl.constexpr, WARMUP: tl.constexpr, LOG_FLOOR,
                      dd_out):
    # no parameter has a default: torch.compile's launch of a user kernel passes exactly the
    # arguments given, and one left to its default broke the compiled backward (H200, torch 2.11)
    # backwards over the chunks: dD += (exp(G_last - G) K) dS, and the gradient of the state
    # entering the chunk, dS <- exp(G_last) dS + (exp(G) Q)^T dO - W^T dD. It reads each chunk's
    # (exp(G) Q)^T dO from dh_local and writes the gradient of its end state to dh (the same
    # buffer, or two of different dtypes: chunk.py's BWD_BUFFERS).
    # SEGMENTED: program (i_v, i_bh, i_s) walks segment i_s (chunks i_s SEG .. i_s SEG + SEG - 1)
    # from dht[i_bh NS + i_s] (or zeros) down to its start, whose gradient goes to
    # dh0[i_bh NS + i_s]. MODE 0 stores dD and dh as above; MODE 1 stores nothing on the way (the
    # segment's own share of the gradient at its start, from a zero gradient at its end); MODE 2
    # starts from the identity with no dO (V = K): its end is the segment's transition transposed,
    # P_s^T (segment_choices.py, "Segments"). Unsegmented (the default) compiles as before.
    # WARMUP (SEGMENTED, MODE 0; segment_choices.py, "Warm-ups"): each segment warms the gradient
    # at its end up alone, from zeros a few chunks later, where the decay is below exp(LOG_FLOOR),
    # reading those chunks' dd and dh_local as `_bwd_local` left them: so dD goes to dd_out and
    # dh is not dh_local (elsewhere dd_out is dd and is not read). WARMUP 2 and 3 split the heads
    # as the forward's do (`_state_pass`), the exact ones on one program per value block and state
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    i_hq = i_h % HQ  # the head of q, k, v this state reads
    NT = tl.cdiv(T, BT)
    if WARMUP == 3:  # (as the last segment's program, the one that goes exact)
        NS = tl.cdiv(NT, SEG)
        i_s = NS - 1
        t_first, t_end = i_s * SEG, NT
    elif SEGMENTED:
        i_s, NS = tl.program_id(2), tl.num_programs(2)
        t_first, t_end = i_s * SEG, tl.minimum(NT, i_s * SEG + SEG)
    else:
        i_s, NS, t_first, t_end = 0, 1, 0, NT
    idx = tl.arange(0, BT)
    # (BK, BV): gradient of the state leaving the current chunk
    b_ds = tl.zeros([BK, BV], dtype=tl.float32)
    edge = 0  # the segment whose start gradient is the initial state's (warm-ups)
    if MODE == 2:
        eye = tl.arange(0, BK)[:, None] == (i_v * BV + tl.arange(0, BV))[None, :]
        b_ds += tl.where(eye, 1., 0.)
    elif WARMUP:
        # as the forward's: a head with a segment (after the first; the last's is at most a
        # segment anyway) decaying above the floor goes exact in one program, the last
        short = segments_decay_below(gcum, i_b, i_h, T, H, SEG, 1, NS - 1, LOG_FLOOR, BT)
        t_first = tl.where(short, t_first, tl.where(i_s == NS - 1, 0, NT))
        t_end = tl.where(short, t_end, NT)
        edge = tl.where(short, 0, NS - 1)
        if WARMUP >= 2:  # (a split launch: a program of the other kind of head does nothing)
            mine = short == (WARMUP == 2)
            t_first, t_end = tl.where(mine, t_first, NT), tl.where(mine, t_end, NT)
            edge = tl.where(mine, edge, -1)
        b_ds = _warmed_gradient(k, w, gcum, dd, dh_local, dht, b_ds, i_v, i_b, i_h, i_hq, i_bh,
                                t_end, T, H, HQ, LOG_FLOOR, K, V, BT, BK, BV, USE_DHT, PRECISION)
    elif USE_DHT:
        p_dht = state_tile(dht, i_bh * NS + i_s, K, V, i_v * BV, BK, BV)
        b_ds += load_tile(p_dht).to(tl.float32)
    for j in range(t_end - t_first):
        i_t = t_end - 1 - j
        rows = i_t * BT + idx
        valid = rows < T
        # (the pointers and loads in this order: the unsegmented pass compiles as before segments)
        if MODE != 2:
            p_local = state_tile(dh_local, i_bh * NT + i_t, K, V, i_v * BV, BK, BV)
        if MODE == 0:
            p_dh = state_tile(dh, i_bh * NT + i_t, K, V, i_v * BV, BK, BV)
        p_k = seq_tile(k, i_b, i_hq, T, HQ, K, i_t * BT, 0, BT, BK)
        # W^T as stored (BK, BT): no transpose in registers on the sequential path
        p_wt = seq_tile_t(w, i_b, i_h, T, H, K, i_t * BT, 0, BT, BK)
        if MODE != 2:
            p_dd = seq_tile(dd, i_b, i_h, T, H, V, i_t * BT, i_v * BV, BT, BV)
            # (BK, BV): the chunk's own (exp(G) Q)^T dO, replaced below by the end state's gradient
            b_local = load_tile(p_local).to(tl.float32)
        if MODE == 0:
            store_tile(p_dh, b_ds)
        b_k = load_tile(p_k)
        b_wt = load_tile(p_wt)
        b_G = tl.load(gcum + (i_b * T + rows) * H + i_h, mask=valid, other=0.)
        last = tl.minimum(T - i_t * BT, BT) - 1
        G_last = tl.sum(tl.where(idx == last, b_G, 0.))
        k_decay = tl.where(valid, tl.exp(G_last - b_G), 0.)
        # the decay on the product's (BT, BV) rows rather than on K's (BT, BK) ones (same maths)
        if MODE == 2:
            b_dd = k_decay[:, None] * dot(b_k, b_ds, PRECISION)
            b_ds = b_ds * tl.exp(G_last) - dot(b_wt, b_dd, PRECISION)
        else:
            b_dd = load_tile(p_dd).to(tl.float32)
            b_dd += k_decay[:, None] * dot(b_k, b_ds, PRECISION)
            if MODE == 0:
                if WARMUP:
                    p_out = seq_tile(dd_out, i_b, i_h, T, H, V, i_t * BT, i_v * BV, BT, BV)
                    store_tile(p_out, b_dd)
                else:
                    store_tile(p_dd, b_dd)
            b_ds = b_ds * tl.exp(G_last) + b_local - dot(b_wt, b_dd, PRECISION)
    if STORE_DH0:  # (with warm-ups the first segment's start gradient is the initial state's)
        store_segment_state(dh0, b_ds, i_bh, i_s, NS, edge, WARMUP, K, V, i_v * BV, BK, BV)


@triton.jit
def _warmup_end(gcum, i_b, i_h, T, H, t_end, LOG_FLOOR, BT: tl.constexpr, NB: tl.constexpr):
    # the earliest chunk end c >= t_end whose chunks t_end .. c - 1 decay a gradient by at most
    # exp(LOG_FLOOR) (their G_last summed), or NT where the chunks after t_end never do: the
    # chunks' G_last read NB at a time, first to last (the last one may be partial)
    NT = tl.cdiv(T, BT)
    end = NT + t_end * 0
    total = tl.sum(tl.zeros([NB], dtype=tl.float32), 0)
    c = t_end
    while (c < NT) & (total > LOG_FLOOR):
        chunks = c + tl.arange(0, NB)
        inside = chunks < NT
        rows = tl.minimum(chunks * BT + BT, T) - 1
        g_last = tl.load(gcum + (i_b * T + rows) * H + i_h, mask=inside, other=0.)
        head = total + tl.cumsum(g_last, 0)  # the decay from t_end to the end of chunk j
        found = tl.min(tl.where(inside & (head <= LOG_FLOOR), chunks, NT), 0)
        end = tl.where(found < NT, found + 1, NT)
        total = tl.where(found < NT, float("-inf"), total + tl.sum(g_last, 0))  # (as `_warmup_start`)
        c = c + NB
    return end


@triton.jit
def _warmed_gradient(k, w, gcum, dd, dh_local, dht, b_ds, i_v, i_b, i_h, i_hq, i_bh, t_end, T, H,
                     HQ, LOG_FLOOR, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                     BK: tl.constexpr, BV: tl.constexpr, USE_DHT: tl.constexpr,
                     PRECISION: tl.constexpr):
    # the gradient of the state leaving chunk t_end - 1, from zeros at `_warmup_end`'s chunk end:
    # off by at most exp(LOG_FLOOR) of the gradient there (each chunk's adjoint map is the
    # transpose of the forward's, of norm <= exp(G_last); segment_choices.py, "Warm-ups"), exact
    # (from dht) where the decay never gets that low. The chunks' dD are their own segments' to
    # store: read here, not written
    NT = tl.cdiv(T, BT)
    c_end = _warmup_end(gcum, i_b, i_h, T, H, t_end, LOG_FLOOR, BT, 64)
    if USE_DHT:
        b_dht = load_tile(state_tile(dht, i_bh, K, V, i_v * BV, BK, BV)).to(tl.float32)
        b_ds += tl.where(c_end == NT, b_dht, 0.)
    idx = tl.arange(0, BT)
    for j in range(c_end - t_end):
        i_t = c_end - 1 - j
        rows = i_t * BT + idx
        valid = rows < T
        p_local = state_tile(dh_local, i_bh * NT + i_t, K, V, i_v * BV, BK, BV)
        b_local = load_tile(p_local).to(tl.float32)
        b_k = load_tile(seq_tile(k, i_b, i_hq, T, HQ, K, i_t * BT, 0, BT, BK))
        b_wt = load_tile(seq_tile_t(w, i_b, i_h, T, H, K, i_t * BT, 0, BT, BK))
        b_G = tl.load(gcum + (i_b * T + rows) * H + i_h, mask=valid, other=0.)
        G_last = tl.sum(tl.where(idx == tl.minimum(T - i_t * BT, BT) - 1, b_G, 0.))
        b_dd = load_tile(seq_tile(dd, i_b, i_h, T, H, V, i_t * BT, i_v * BV, BT, BV)).to(tl.float32)
        b_dd += tl.where(valid, tl.exp(G_last - b_G), 0.)[:, None] * dot(b_k, b_ds, PRECISION)
        b_ds = b_ds * tl.exp(G_last) + b_local - dot(b_wt, b_dd, PRECISION)
    return b_ds


@triton.jit
def _bwd_chunk_kernel(q, k, v, beta, d, dd, gcum, linv, h, dh, ds, dg_local, dk, dv, dbeta, dg,
                      scale, T, H, HQ, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                      BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr):
    # one program per chunk and head, looping over the value columns: dk, dv, dbeta and dg, with
    # one (BT, BK) float32 accumulator (dk) and one (BT, BT) (dA); the gradient of W is never
    # formed (see dA below). dq, dS and dG's share of the scores came from `_bwd_local_kernel`
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    i_hq = i_h % HQ  # the head of q, k, v this state reads
    NT = tl.cdiv(T, BT)
    idx = tl.arange(0, BT)
    rows = i_t * BT + idx
    valid = rows < T
    # rows past the end of the sequence are masked out: their G is 0, so exp(G_i - G_j) can overflow
    strict = (idx[:, None] > idx[None, :]) & valid[:, None]
    b_k = load_tile(seq_tile(k, i_b, i_hq, T, HQ, K, i_t * BT, 0, BT, BK))
    b_beta = tl.load(beta + (i_b * T + rows) * H + i_h, mask=valid, other=0.).to(tl.float32)
    b_G = tl.load(gcum + (i_b * T + rows) * H + i_h, mask=valid, other=0.)
    b_linv = tl.load(linv + (i_bh * NT + i_t) * BT * BT + idx[:, None] * BT + idx[None, :])
    last = tl.minimum(T - i_t * BT, BT) - 1
    G_last = tl.sum(tl.where(idx == last, b_G, 0.))
    e_G = tl.exp(b_G)
    k_decay = tl.where(valid, tl.exp(G_last - b_G), 0.)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    # (BT, BT): the gradient of L (before the sign and the strict-lower mask)
    b_da = tl.zeros([BT, BT], dtype=tl.float32)
    b_dbeta = tl.zeros([BT], dtype=tl.float32)
    b_dG = tl.zeros([BT], dtype=tl.float32)
    dG_last = 0.
    for i_v in range(tl.cdiv(V, BV)):
        b_h = load_tile(state_tile(h, i_bh * NT + i_t, K, V, i_v * BV, BK, BV))
        b_dh = load_tile(state_tile(dh, i_bh * NT + i_t, K, V, i_v * BV, BK, BV))
        b_d = load_tile(seq_tile(d, i_b, i_h, T, H, V, i_t * BT, i_v * BV, BT, BV))
        b_dd = load_tile(seq_tile(dd, i_b, i_h, T, H, V, i_t * BT, i_v * BV, BT, BV))
        # leaving state: S_BT += (exp(G_last - G) K)^T D
        dk_state = k_decay[:, None] * dot(b_d, tl.trans(b_dh), PRECISION)
        b_dk += dk_state
        sk = tl.sum(b_k * dk_state, axis=1)
        b_dG -= sk
        dG_last += tl.sum(sk) + tl.exp(G_last) * tl.sum(b_h.to(tl.float32) * b_dh.to(tl.float32))
        # D = U - W S0 with U = L^-1 (beta V), W = L^-1 (beta exp(G) K): dU = dD, dW = -dD S0^T,
        # so L^-T dW = -(L^-T dD) S0^T, and dL^-1's share dA = (L^-T dD) U^T + (L^-T dW) W^T
        # = (L^-T dD) (U - W S0)^T = (L^-T dD) D^T: neither W nor U is read
        b_dyv = dot(tl.trans(b_linv), b_dd, PRECISION)
        b_da += dot(b_dyv, tl.trans(b_d), PRECISION)
        b_dyk = -dot(b_dyv, tl.trans(b_h), PRECISION)
        b_dk += b_dyk * (b_beta * e_G)[:, None]
        dyk_k = tl.sum(b_dyk * b_k, axis=1) * e_G
        b_dbeta += dyk_k
        b_dG += dyk_k * b_beta
        b_v = load_tile(seq_tile(v, i_b, i_hq, T, HQ, V, i_t * BT, i_v * BV, BT, BV)).to(tl.float32)
        b_dbeta += tl.sum(b_dyv * b_v, axis=1)
        store_tile(seq_tile(dv, i_b, i_h, T, H, V, i_t * BT, i_v * BV, BT, BV), b_dyv * b_beta[:, None])
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
    # in-chunk scores, O += (causal exp(G_i - G_j) Q K^T) D: dk's share dS^T Q
    b_ds = tl.load(ds + (i_bh * NT + i_t).to(tl.int64) * BT * BT + idx[:, None] * BT + idx[None, :])
    b_q = load_tile(seq_tile(q, i_b, i_hq, T, HQ, K, i_t * BT, 0, BT, BK))
    b_dk += dot(tl.trans(b_ds), b_q, PRECISION) * scale
    b_dG += tl.load(dg_local + (i_b * T + rows) * H + i_h, mask=valid, other=0.)
    b_dG += tl.where(idx == last, dG_last, 0.)
    b_dG = tl.where(valid, b_dG, 0.)
    # G is a cumulative sum of g inside the chunk: dg_j = sum_{i >= j} dG_i
    b_dg = tl.sum(b_dG) - tl.cumsum(b_dG, axis=0) + b_dG
    store_tile(seq_tile(dk, i_b, i_h, T, H, K, i_t * BT, 0, BT, BK), b_dk)
    tl.store(dbeta + (i_b * T + rows) * H + i_h, rounded(b_dbeta, dbeta.dtype.element_ty), mask=valid)
    tl.store(dg + (i_b * T + rows) * H + i_h, rounded(b_dg, dg.dtype.element_ty), mask=valid)
