"""RWKV-7 recurrence in Triton, forward and backward, as a fused token loop with chunk checkpoints.

Per token t, state S of shape [K, V] (a^T S read before the decay):
    S = S * exp(w_t)[:, None] + b_t (a_t^T S) + k_t v_t^T;   o_t = S^T r_t
Each program owns one (batch, head, value block) and keeps its [K, BV] state in registers while it
walks the tokens. The forward saves the state every CHUNK tokens; the backward walks the chunks in
reverse, recomputes the chunk's states from its checkpoint into a per-program scratch buffer, then
runs the adjoint recurrence token by token backwards:
    dS_t += r_t do_t^T;  dS_{t-1} = dS_t * exp(w_t)[:, None] + a_t (dS_t^T b_t)^T
Gradients of the [K]-sized inputs are sums over V, so each value block writes its own partial sum
and the launcher adds them. Tested against `ltm.ops.rwkv7.naive.naive_rwkv7`.

The chunked kernel, `ltm.kernels.triton_chunk_rwkv7` (kernels/rwkv7/chunk.py), is what the model
uses: on an H100 it took 2.68 against this loop's 22.2 ms fwd+bwd at 8,2048,8,128. The loop stays as
`triton_fused_recurrent_rwkv7`, a second, simpler implementation to check and time it against.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ltm.kernels.common import block_size, cdiv, check_rwkv7_inputs, nan_buffer

# Tokens between two saved states: the backward recomputes at most this many states per step back.
CHUNK = 32


@triton.jit
def _fwd_kernel(r, w, k, v, a, b, o, h, h0, ht, T, H, K: tl.constexpr,
                V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                USE_H0: tl.constexpr, STORE_HT: tl.constexpr):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    NT = tl.cdiv(T, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    p_state = o_k[:, None] * V + o_v[None, :]
    b_s = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        b_s += tl.load(h0 + i_bh * K * V + p_state, mask=m_kv, other=0.).to(tl.float32)
    for t in range(T):
        if t % BT == 0:
            tl.store(h + (i_bh * NT + t // BT) * K * V + p_state, b_s, mask=m_kv)
        p_k = (i_b * T + t) * H * K + i_h * K + o_k
        p_v = (i_b * T + t) * H * V + i_h * V + o_v
        b_r = tl.load(r + p_k, mask=m_k, other=0.).to(tl.float32)
        b_w = tl.load(w + p_k, mask=m_k, other=0.).to(tl.float32)
        b_k = tl.load(k + p_k, mask=m_k, other=0.).to(tl.float32)
        b_a = tl.load(a + p_k, mask=m_k, other=0.).to(tl.float32)
        b_b = tl.load(b + p_k, mask=m_k, other=0.).to(tl.float32)
        b_v = tl.load(v + p_v, mask=m_v, other=0.).to(tl.float32)
        # (BV,): a^T S, before the decay
        sa = tl.sum(b_a[:, None] * b_s, axis=0)
        b_s = b_s * tl.exp(b_w)[:, None] + b_b[:, None] * sa[None, :] + b_k[:, None] * b_v[None, :]
        b_o = tl.sum(b_r[:, None] * b_s, axis=0)
        tl.store(o + p_v, b_o.to(o.dtype.element_ty), mask=m_v)
    if STORE_HT:
        tl.store(ht + i_bh * K * V + p_state, b_s, mask=m_kv)


@triton.jit
def _bwd_kernel(r, w, k, v, a, b, h, do, dht, scratch, dr, dw, dk, dv, da, db, dh0, T,
                H, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                BK: tl.constexpr, BV: tl.constexpr, USE_DHT: tl.constexpr,
                STORE_DH0: tl.constexpr):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    NV = tl.num_programs(0)
    NT = tl.cdiv(T, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    p_state = o_k[:, None] * V + o_v[None, :]
    # this program's scratch: BT states of [BK, BV]
    p_scratch = scratch + (i_bh * NV + i_v) * BT * BK * BV + o_k[:, None] * BV + tl.arange(0, BV)[None, :]
    # (BK, BV): gradient of the state after the current token
    b_ds = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        b_ds += tl.load(dht + i_bh * K * V + p_state, mask=m_kv, other=0.).to(tl.float32)
    for j in range(NT):
        i_t = NT - 1 - j
        t_end = tl.minimum(T, i_t * BT + BT)
        b_s = tl.load(h + (i_bh * NT + i_t) * K * V + p_state, mask=m_kv, other=0.)
        for t in range(i_t * BT, t_end):
            tl.store(p_scratch + (t - i_t * BT) * BK * BV, b_s)
            p_k = (i_b * T + t) * H * K + i_h * K + o_k
            p_v = (i_b * T + t) * H * V + i_h * V + o_v
            b_w = tl.load(w + p_k, mask=m_k, other=0.).to(tl.float32)
            b_k = tl.load(k + p_k, mask=m_k, other=0.).to(tl.float32)
            b_a = tl.load(a + p_k, mask=m_k, other=0.).to(tl.float32)
            b_b = tl.load(b + p_k, mask=m_k, other=0.).to(tl.float32)
            b_v = tl.load(v + p_v, mask=m_v, other=0.).to(tl.float32)
            sa = tl.sum(b_a[:, None] * b_s, axis=0)
            b_s = b_s * tl.exp(b_w)[:, None] + b_b[:, None] * sa[None, :] + b_k[:, None] * b_v[None, :]
        # the states written above are read back by other threads of this program
        tl.debug_barrier()
        for jt in range(i_t * BT, t_end):
            t = i_t * BT + t_end - 1 - jt
            b_sp = tl.load(p_scratch + (t - i_t * BT) * BK * BV)
            p_k = (i_b * T + t) * H * K + i_h * K + o_k
            p_v = (i_b * T + t) * H * V + i_h * V + o_v
            p_part = ((i_v * (tl.num_programs(1) // H) + i_b) * T + t) * H * K + i_h * K + o_k
            b_r = tl.load(r + p_k, mask=m_k, other=0.).to(tl.float32)
            b_w = tl.load(w + p_k, mask=m_k, other=0.).to(tl.float32)
            b_k = tl.load(k + p_k, mask=m_k, other=0.).to(tl.float32)
            b_a = tl.load(a + p_k, mask=m_k, other=0.).to(tl.float32)
            b_b = tl.load(b + p_k, mask=m_k, other=0.).to(tl.float32)
            b_v = tl.load(v + p_v, mask=m_v, other=0.).to(tl.float32)
            b_do = tl.load(do + p_v, mask=m_v, other=0.).to(tl.float32)
            e_w = tl.exp(b_w)
            sa = tl.sum(b_a[:, None] * b_sp, axis=0)
            b_s = b_sp * e_w[:, None] + b_b[:, None] * sa[None, :] + b_k[:, None] * b_v[None, :]
            b_ds += b_r[:, None] * b_do[None, :]
            tl.store(dr + p_part, tl.sum(b_s * b_do[None, :], axis=1), mask=m_k)
            tl.store(dk + p_part, tl.sum(b_ds * b_v[None, :], axis=1), mask=m_k)
            tl.store(db + p_part, tl.sum(b_ds * sa[None, :], axis=1), mask=m_k)
            tl.store(dw + p_part, e_w * tl.sum(b_ds * b_sp, axis=1), mask=m_k)
            b_dv = tl.sum(b_ds * b_k[:, None], axis=0)
            tl.store(dv + p_v, b_dv.to(dv.dtype.element_ty), mask=m_v)
            # (BV,): gradient of a^T S
            dsa = tl.sum(b_ds * b_b[:, None], axis=0)
            tl.store(da + p_part, tl.sum(b_sp * dsa[None, :], axis=1), mask=m_k)
            b_ds = b_ds * e_w[:, None] + b_a[:, None] * dsa[None, :]
        # the next chunk overwrites the scratch that was just read
        tl.debug_barrier()
    if STORE_DH0:
        tl.store(dh0 + i_bh * K * V + p_state, b_ds, mask=m_kv)


def _value_block(K: int, V: int) -> int:
    # narrow value blocks: more programs walk the tokens side by side. Measured on an H200 (bf16,
    # forward+backward): 16 against 64 at K = V = 64 took 9.2 against 16.3 ms at 16,1024,12,64;
    # 16 against 32 at K = V = 128, 21.9 against 22.9 ms at 8,2048,8,128 (gpu/sweep_launch.py)
    return 16


def _launch_options(K: int, V: int) -> dict:
    # from the same sweep: 8 warps for a (128, 16) state, 4 for (64, 16)
    return {"num_warps": 8 if K > 64 else 4}


def _launch(K: int, V: int, launch: tuple | None) -> tuple[int, dict]:
    """The value block and launch options: `_value_block` and `_launch_options`, or one call's
    (value_block, num_warps) where given (`triton_fused_recurrent_rwkv7`)."""
    value_block, num_warps = launch or (None, None)
    BV = _value_block(K, V) if value_block is None else min(value_block, V)
    return BV, _launch_options(K, V) if num_warps is None else {"num_warps": num_warps}


def _rwkv7_fwd(r, w, k, v, a, b, initial_state, output_final_state, launch=None):
    B, T, H, K = r.shape
    V = v.shape[-1]
    (BV, options), BT, BK = _launch(K, V, launch), CHUNK, block_size(K)
    NT = cdiv(T, BT)
    h = nan_buffer((B * H, NT, K, V), torch.float32, r.device)
    o = nan_buffer((B, T, H, V), v.dtype, r.device)
    ht = nan_buffer((B, H, K, V), torch.float32, r.device) if output_final_state else None
    _fwd_kernel[(cdiv(V, BV), B * H)](
        r, w, k, v, a, b, o, h, initial_state, ht, T, H, K, V, BT, BK, BV,
        initial_state is not None, output_final_state, **options)
    return o, ht, h


def _rwkv7_bwd(r, w, k, v, a, b, initial_state, h, do, dht, launch=None):
    B, T, H, K = r.shape
    V = v.shape[-1]
    (BV, options), BT, BK = _launch(K, V, launch), CHUNK, block_size(K)
    NV = cdiv(V, BV)
    dev = r.device
    scratch = torch.empty(B * H * NV * BT * BK * BV, dtype=torch.float32, device=dev)
    # partial sums over the value blocks, added below
    parts = [nan_buffer((NV, B, T, H, K), torch.float32, dev) for _ in range(5)]
    dv = nan_buffer(v.shape, v.dtype, dev)
    dh0 = nan_buffer((B, H, K, V), torch.float32, dev) if initial_state is not None else None
    _bwd_kernel[(NV, B * H)](
        r, w, k, v, a, b, h, do, dht, scratch, *parts[:2], parts[2], dv, *parts[3:], dh0, T,
        H, K, V, BT, BK, BV, dht is not None, dh0 is not None, **options)
    dr, dw, dk, da, db = (p.sum(0).to(x.dtype) for p, x in zip(parts, (r, w, k, a, b)))
    return dr, dw, dk, dv, da, db, dh0


class FusedRecurrentRWKV7Function(torch.autograd.Function):

    @staticmethod
    def forward(ctx, r, w, k, v, a, b, initial_state, output_final_state, launch=None):
        o, ht, h = _rwkv7_fwd(r, w, k, v, a, b, initial_state, output_final_state, launch)
        ctx.save_for_backward(r, w, k, v, a, b, initial_state, h)
        ctx.launch = launch
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        r, w, k, v, a, b, initial_state, h = ctx.saved_tensors
        grads = _rwkv7_bwd(r, w, k, v, a, b, initial_state, h, do.contiguous(),
                           None if dht is None else dht.contiguous(), ctx.launch)
        # a gradient per input: one more (None) where the call passed its launch
        return (*grads, None) + ((None,) if ctx.launch is not None else ())


def triton_fused_recurrent_rwkv7(
    r: torch.Tensor,
    w: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    *,
    value_block: int | None = None,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RWKV-7 time mixing in Triton (fused token loop, states saved every CHUNK tokens for the
    backward); differentiable in r, w, k, v, a, b and initial_state.

    Per token: S = S * exp(w)[:, None] + b (a^T S) + k v^T with a^T S read before the decay;
    o = S^T r. Same function as `ltm.ops.rwkv7.naive.naive_rwkv7`, which it is tested against.

    Args:
        r, w, k, a, b: [B, T, H, K]; v: [B, T, H, V]; all float32, bfloat16 or float16 (one dtype),
            K, V <= 128, any T >= 1. w is the log decay (<= 0).
        initial_state: [B, H, K, V] (any float dtype, used in float32) or None for zeros.
    Returns:
        o: [B, T, H, V] in the dtype of v; the final state [B, H, K, V] in float32 when
        `output_final_state`, else None.

    Launch options, for measurements (gpu/sweep_launch.py rwkv7_loop); None, the default, keeps
    the launcher's choice, and a value that is not a power of two raises ValueError:
        value_block: the value columns per program, at most V (default `_value_block`, 16).
        num_warps: the warps per program (default `_launch_options`: 8 at K > 64, else 4).
    """
    check_rwkv7_inputs(r, w, k, v, a, b, initial_state)
    for name, n in (("value_block", value_block), ("num_warps", num_warps)):
        if n is not None and (not isinstance(n, int) or n < 1 or n & (n - 1)):
            raise ValueError(f"{name} must be a power of two or None, got {n!r}")
    h0 = None if initial_state is None else initial_state.float().contiguous()
    # the launch only when given: the default call is the one torch.compile has always traced
    extra = () if value_block is None and num_warps is None else ((value_block, num_warps),)
    return FusedRecurrentRWKV7Function.apply(*(x.contiguous() for x in (r, w, k, v, a, b)), h0,
                                    output_final_state, *extra)
