"""Forward kernels of the chunked (gated) delta rule after the prep (`chunk_prep.py`: G, L^-1, W and
U per chunk); `chunk.py` launches them and gives the maths.

`_fwd_kernel` (sequential over chunks): the state entering each chunk and the applied deltas
D = U - W S0. `_output_kernel` (chunk-parallel): O.
With segments (segment_choices.py): `_fwd_kernel` per segment in parallel (end states from zeros and
transition matrices), `_segment_states_kernel` (sequential over segments), `_fwd_kernel` again;
or, with decay warm-ups (WARMUP), `_fwd_kernel` once, each segment from zeros a few chunks before.
`_fwd_overlapped_kernel`: `_fwd_kernel`'s and `_output_kernel`'s work (`_state_pass`, `_output_tile`)
in one launch, the outputs of each group of chunks computed while the state pass goes on.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ltm.kernels.common import (_INTERPRETED, dot, load_tile, segments_decay_below, seq_tile,
                                seq_tile_t, state_tile, store_segment_state, store_tile)


@triton.jit
def _fwd_kernel(k, w, u, gcum, h, d, h0, ht, q, o, scale, T, H, HQ, SEG, K: tl.constexpr,
                V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                USE_H0: tl.constexpr, STORE_HT: tl.constexpr, STORE_HD: tl.constexpr,
                SEGMENTED: tl.constexpr, TRANSITION: tl.constexpr, FUSE_O: tl.constexpr,
                PRECISION: tl.constexpr, WARMUP: tl.constexpr, LOG_FLOOR, v, beta, linv,
                FROM_LINV: tl.constexpr):
    # the sequential part only: the state entering each chunk and the deltas D; the outputs are
    # computed afterwards, all chunks in parallel, by `_output_kernel`. SEGMENTED: program
    # (i_v, i_bh, i_s) walks segment i_s, chunks i_s SEG .. (i_s + 1) SEG - 1, from h0[i_bh NS +
    # i_s] (or zeros) to its end state in ht[i_bh NS + i_s]; otherwise (the default, compiled as
    # before segments existed) program (i_v, i_bh) walks the whole sequence from h0[i_bh].
    # TRANSITION: U taken as 0 and the state started from the identity (V = K), so that the end
    # state is the segment's transition matrix (segment_choices.py, "Segments").
    # FUSE_O: the outputs too, chunk by chunk as the state passes (`_output_kernel`'s maths), so a
    # forward without a backward neither writes nor reads the per-chunk states and D (STORE_HD off)
    # WARMUP (with SEGMENTED; segment_choices.py, "Warm-ups"): each segment finds its entering state
    # alone, from zeros a few chunks earlier, where the decay since then is below exp(LOG_FLOOR);
    # heads that never decay that far run exact in one program. WARMUP 2: the decaying heads only
    # (the others' programs do nothing); 3: the others only, exact, on a grid of one program per
    # value block and state (SEG still sizes the segments their decays are judged by)
    # FROM_LINV (a forward without a backward, in one segment or by warm-ups): D from L^-1, v and
    # beta (`_deltas_from_linv`), the prep having written neither W nor U
    _state_pass(k, w, u, gcum, h, d, h0, ht, q, o, scale, None, tl.program_id(0), tl.program_id(1),
                T, H, HQ, SEG, K, V, BT, BK, BV, USE_H0, STORE_HT, STORE_HD, SEGMENTED, TRANSITION,
                FUSE_O, 0, 1, PRECISION, WARMUP, LOG_FLOOR, v, beta, linv, FROM_LINV)


@triton.jit
def _state_pass(k, w, u, gcum, h, d, h0, ht, q, o, scale, ready, i_v, i_bh, T, H, HQ, SEG,
                K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                USE_H0: tl.constexpr, STORE_HT: tl.constexpr, STORE_HD: tl.constexpr,
                SEGMENTED: tl.constexpr, TRANSITION: tl.constexpr, FUSE_O: tl.constexpr,
                SIGNAL: tl.constexpr, EVERY: tl.constexpr, PRECISION: tl.constexpr,
                WARMUP: tl.constexpr, LOG_FLOOR, v, beta, linv, FROM_LINV: tl.constexpr):
    # `_fwd_kernel`'s work for value block i_v of state i_bh. (NEGATIVE, not kept: at K = 128 the
    # state as two (64, BV) row halves, D = U - W1 S1 - W2 S2 and each half updated by its own
    # product, was slower: forward 0.278 against 0.263 ms at 2,8192,8,128, 0.770 against 0.674 at
    # 1,32768,4,128; H100, gpu/results/state-halves-h100-2026-11-26-s19-call1.diff of a40e938.)
    # SIGNAL > 0 (the program's threads):
    # once the states and D of a group of EVERY chunks are stored, add SIGNAL to the group's count
    # (`_group_count`, `_fwd_overlapped_kernel`)
    i_b, i_h = i_bh // H, i_bh % H
    i_hq = i_h % HQ  # the head of q, k, v this state reads
    NT = tl.cdiv(T, BT)
    if WARMUP == 3:  # (the exact heads' whole pass, the others' none: below)
        i_s, NS = 0, tl.cdiv(NT, SEG)
        t_first, t_end = 0, NT
    elif SEGMENTED:
        i_s, NS = tl.program_id(2), tl.num_programs(2)
        t_first, t_end = i_s * SEG, tl.minimum(NT, i_s * SEG + SEG)
    else:
        i_s, NS, t_first, t_end = 0, 1, 0, NT
    idx = tl.arange(0, BT)
    b_s = tl.zeros([BK, BV], dtype=tl.float32)
    edge = NS - 1  # the segment whose end state is the final one (warm-ups)
    if TRANSITION:
        eye = tl.arange(0, BK)[:, None] == (i_v * BV + tl.arange(0, BV))[None, :]
        b_s += tl.where(eye, 1., 0.)
    elif WARMUP:
        # a head whose decay over some segment stays above the floor (so a warm-up could grow
        # past a segment's length, up to the whole prefix) goes exact in one program, the first;
        # its other segments idle: never slower than the one-segment pass
        short = segments_decay_below(gcum, i_b, i_h, T, H, SEG, 0, NS - 1, LOG_FLOOR, BT)
        if WARMUP == 3:  # the exact heads from h0, no warm-up code (Triton 3.6 failed to lower
            # this kernel with it: ConvertTritonGPUToLLVM, sm_90, 2026-12-07)
            t_end = tl.where(short, 0, t_end)
            edge = tl.where(short, -1, 0)
            if USE_H0:
                b_s += load_tile(state_tile(h0, i_bh, K, V, i_v * BV, BK, BV)).to(tl.float32)
        else:
            t_first = tl.where(short, t_first, 0)
            t_end = tl.where(short, t_end, tl.where(i_s == 0, NT, 0))
            edge = tl.where(short, NS - 1, 0)
            if WARMUP == 2:  # (a split launch: the exact heads' programs do nothing here)
                t_first, t_end = tl.where(short, t_first, 0), tl.where(short, t_end, 0)
                edge = tl.where(short, edge, -1)
            b_s = _warmed_state(k, w, u, gcum, h0, b_s, i_v, i_b, i_h, i_hq, i_bh, t_first, T, H,
                                HQ, LOG_FLOOR, K, V, BT, BK, BV, USE_H0, PRECISION, v, beta, linv,
                                FROM_LINV)
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
        if FROM_LINV:
            b_G = tl.load(gcum + (i_b * T + rows) * H + i_h, mask=valid, other=0.)
            b_kt = load_tile(p_kt)
            b_d = _deltas_from_linv(tl.trans(b_kt), v, beta, linv, b_s, b_G, rows, valid, i_b, i_h,
                                    i_hq, i_bh, i_t, i_v, T, H, HQ, V, BT, BV, PRECISION)
        else:
            p_w = seq_tile(w, i_b, i_h, T, H, K, i_t * BT, 0, BT, BK)
            # (the pointers in this order: the one-segment pass compiles as before segments existed)
            if not TRANSITION:
                p_u = seq_tile(u, i_b, i_h, T, H, V, i_t * BT, i_v * BV, BT, BV)
            b_kt = load_tile(p_kt)
            b_w = load_tile(p_w)
            if TRANSITION:
                b_u = tl.zeros([BT, BV], dtype=tl.float32)
            else:
                b_u = load_tile(p_u)
            b_G = tl.load(gcum + (i_b * T + rows) * H + i_h, mask=valid, other=0.)
            b_d = b_u - dot(b_w, b_s, PRECISION)
        if STORE_HD:
            p_d = seq_tile(d, i_b, i_h, T, H, V, i_t * BT, i_v * BV, BT, BV)
        last = tl.minimum(T - i_t * BT, BT) - 1
        G_last = tl.sum(tl.where(idx == last, b_G, 0.))
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
    if STORE_HT:  # (with warm-ups the last segment's end state is the final state)
        store_segment_state(ht, b_s, i_bh, i_s, NS, edge, WARMUP, K, V, i_v * BV, BK, BV)


@triton.jit
def _deltas_from_linv(b_k, v, beta, linv, b_s, b_G, rows, valid, i_b, i_h, i_hq, i_bh, i_t, i_v, T,
                      H, HQ, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
                      PRECISION: tl.constexpr):
    # D = U - W S0 = L^-1 (beta (V - exp(G) K S0)): one chunk's deltas for value block i_v from
    # its L^-1 (the prep's, (BT, BT)), keys b_k (BT, BK), values and betas, so that the forward
    # neither writes nor reads W and U (FlashQLA's forward keeps them out of memory likewise).
    # b_k is the pass's K^T tile transposed in registers: a second load of K as (BT, BK) spilled
    # 540-636 bytes a thread where this spills 168, the W and U pass 272 (ptxas sm_90, Triton
    # 3.6, K = 128, BV 32, 4 warps, 2 stages). Rows past T: beta 0 and L^-1's row a unit row, so
    # D's row is 0 as from U and W
    b_v = load_tile(seq_tile(v, i_b, i_hq, T, HQ, V, i_t * BT, i_v * BV, BT, BV)).to(tl.float32)
    b_beta = tl.load(beta + (i_b * T + rows) * H + i_h, mask=valid, other=0.).to(tl.float32)
    NT = tl.cdiv(T, BT)
    idx = tl.arange(0, BT)
    p_l = linv + (i_bh * NT + i_t).to(tl.int64) * BT * BT + idx[:, None] * BT + idx[None, :]
    b_l = tl.load(p_l)
    b_r = b_beta[:, None] * (b_v - tl.exp(b_G)[:, None] * dot(b_k, b_s, PRECISION))
    return dot(b_l, b_r, PRECISION)


@triton.jit
def _warmup_start(gcum, i_b, i_h, T, H, t_first, LOG_FLOOR, BT: tl.constexpr, NB: tl.constexpr):
    # the latest chunk c <= t_first whose chunks c .. t_first - 1 decay a state by at most
    # exp(LOG_FLOOR) (their G_last summed), or 0 where no chunk before t_first does: the chunks'
    # G_last read NB at a time, last to first (all full chunks: they precede a segment)
    start = t_first * 0
    total = tl.sum(tl.zeros([NB], dtype=tl.float32), 0)
    c = t_first
    while (c > 0) & (total > LOG_FLOOR):
        lo = tl.maximum(c - NB, 0)
        chunks = lo + tl.arange(0, NB)
        inside = chunks < c
        g_last = tl.load(gcum + (i_b * T + chunks * BT + BT - 1) * H + i_h, mask=inside, other=0.)
        tail = total + tl.cumsum(g_last, 0, reverse=True)  # the decay from chunk j to t_first
        found = tl.max(tl.where(inside & (tail <= LOG_FLOOR), chunks, -1), 0)
        start = tl.where(found >= 0, found, 0)
        # (-inf, not LOG_FLOOR - 1: under torch.compile a float argument is float64, and the loop's
        # float32 total may not change type)
        total = tl.where(found >= 0, float("-inf"), total + tl.sum(g_last, 0))
        c = lo
    return start


@triton.jit
def _warmed_state(k, w, u, gcum, h0, b_s, i_v, i_b, i_h, i_hq, i_bh, t_first, T, H, HQ, LOG_FLOOR,
                  K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                  BV: tl.constexpr, USE_H0: tl.constexpr, PRECISION: tl.constexpr, v, beta, linv,
                  FROM_LINV: tl.constexpr):
    # the state entering chunk t_first, from zeros at `_warmup_start`'s chunk: off from the true
    # one by at most exp(LOG_FLOOR) times the state there, for each chunk's map S -> exp(G_last)
    # (I - (exp(G_last - G) K)^T W) S has norm <= exp(G_last) when every token's I - beta k k^T
    # does not grow a state (beta |k|^2 in [0, 2]: unit keys, beta in [0, 1]). Exact (from h0)
    # where the decay never gets that low: the warm-up then starts at chunk 0
    t_warm = _warmup_start(gcum, i_b, i_h, T, H, t_first, LOG_FLOOR, BT, 64)
    if USE_H0:
        b_h0 = load_tile(state_tile(h0, i_bh, K, V, i_v * BV, BK, BV)).to(tl.float32)
        b_s += tl.where(t_warm == 0, b_h0, 0.)
    idx = tl.arange(0, BT)
    for i_t in range(t_warm, t_first):  # full chunks: they precede t_first
        b_kt = load_tile(seq_tile_t(k, i_b, i_hq, T, HQ, K, i_t * BT, 0, BT, BK))
        b_G = tl.load(gcum + (i_b * T + i_t * BT + idx) * H + i_h)
        G_last = tl.sum(tl.where(idx == BT - 1, b_G, 0.))
        if FROM_LINV:  # (as the pass does, `_deltas_from_linv`)
            rows = i_t * BT + idx
            b_d = _deltas_from_linv(tl.trans(b_kt), v, beta, linv, b_s, b_G, rows, rows < T, i_b,
                                    i_h, i_hq, i_bh, i_t, i_v, T, H, HQ, V, BT, BV, PRECISION)
        else:
            b_w = load_tile(seq_tile(w, i_b, i_h, T, H, K, i_t * BT, 0, BT, BK))
            b_u = load_tile(seq_tile(u, i_b, i_h, T, H, V, i_t * BT, i_v * BV, BT, BV))
            b_d = b_u - dot(b_w, b_s, PRECISION)
        b_s = b_s * tl.exp(G_last) + dot(b_kt, b_d * tl.exp(G_last - b_G)[:, None], PRECISION)
    return b_s


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
                           STORE_HT: tl.constexpr, PRECISION: tl.constexpr,
                           REVERSE: tl.constexpr):
    # sequential over the segments: S_{s+1} = P_s S_s + E_s from each segment's transition P_s
    # (K, K) and its end state from zeros E_s; the state entering segment s goes to hs[i_bh NS + s].
    # REVERSE (the backward): the segments last to first, P_s^T given as p, E_s the gradient at
    # segment s's start from a zero one at its end, h0 the final state's gradient; hs then gets
    # the gradient at each segment's end and ht the initial state's
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    b_s = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        b_s += load_tile(state_tile(h0, i_bh, K, V, i_v * BV, BK, BV)).to(tl.float32)
    for j in range(NS):
        i_s = NS - 1 - j if REVERSE else j
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
    # on an H200 and the outputs came out wrong). `ready` is zeroed by the prep (ZERO_READY)
    ticket = tl.atomic_add(ready, 1)
    tl.debug_barrier()
    NV, NT = tl.cdiv(V, BV), tl.cdiv(T, BT)
    if ticket < NV * BH:
        _state_pass(k, w, u, gcum, h, d, h0, ht, q, o, scale, ready, ticket % NV, ticket // NV,
                    T, H, HQ, NT, K, V, BT, BK, BV, USE_H0, STORE_HT, True, False, False, False,
                    LANES, EVERY, PRECISION, False, 0., None, None, None, False)
    else:
        NVO = tl.cdiv(V, BVO)
        job = ticket - NV * BH
        i_t, i_bh, i_v = job // (BH * NVO), (job // NVO) % BH, job % NVO
        flag = _group_count(ready, i_bh, i_t, NT, EVERY)
        if _INTERPRETED:
            # the interpreter runs the programs one after another, so a wait not met at once never
            # is: such a group's outputs come out NaN (scaled by it), for the tests to see
            short = tl.atomic_add(flag, 0) < NV * LANES
            scale = scale * tl.where(short, float("nan"), 1.)
        else:
            while tl.atomic_add(flag, 0, sem="acquire") < NV * LANES:
                tl.debug_barrier()
            tl.debug_barrier()
        _output_tile(q, k, gcum, h, d, o, scale, i_v, i_t, i_bh, T, H, HQ, K, V, BT, BK, BVO,
                     PRECISION)

