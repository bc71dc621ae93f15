"""Chunked (gated) delta rule in Triton: the launchers, the autograd Function and the public op
`triton_chunk_delta_rule`. The kernels are in `chunk_fwd.py` and `chunk_bwd.py`; everything a
launch chooses (chunk, value blocks, warps, stages, tile precision) is decided here, in one module,
so that gpu/sweep_launch.py and gpu/delta_rule_variants.py can patch it in one place.

Per chunk of BT tokens, with G the in-chunk cumulative log decay and S0 the state entering it:
    A    = strict_lower(beta_i k_i.k_j exp(G_i - G_j)),  L = I + A
    W    = L^-1 (beta exp(G) K),  U = L^-1 (beta V),  D = U - W S0     (D: the applied deltas)
    O    = scale [exp(G) Q S0 + (causal exp(G_i - G_j) Q K^T) D]
    S_BT = exp(G_last) S0 + (exp(G_last - G) K)^T D
Forward kernels (chunk_fwd.py): `_prep_fwd_kernel` (chunk-parallel: L^-1, W, U), `_fwd_kernel`
(sequential over chunks: states and D), `_output_kernel` (chunk-parallel: O). Backward kernels
(chunk_bwd.py): `_bwd_local_kernel` (chunk-parallel: the in-chunk parts of dD and of the state
gradients), `_bwd_state_kernel` (sequential, backwards: the rest of dD and of the state
gradients), `_bwd_chunk_kernel` (chunk-parallel: dq, dk, dv, dbeta, dg). Tested against
`ltm.ops.delta_rule.naive.naive_delta_rule`.
"""
from __future__ import annotations

import torch
import triton

from ltm.kernels.common import (block_size, check_btd, check_dtype, check_head_dim, check_state,
                                dot_precision, intermediate_dtype, nan_buffer)
from ltm.kernels.delta_rule.chunk_bwd import _bwd_chunk_kernel, _bwd_local_kernel, _bwd_state_kernel
from ltm.kernels.delta_rule.chunk_fwd import _fwd_kernel, _output_kernel, _prep_fwd_kernel

# Tokens per chunk. 64 keeps the in-chunk matrices on the tensor cores and the number of sequential
# steps low; the tail chunk of a sequence whose length is no multiple of it is masked.
CHUNK = 64
# Invert L's 16 x 16 diagonal blocks by repeated squaring (tensor cores) rather than forward
# substitution (15 dependent row updates); gpu/delta_rule_variants.py times the two.
INVERSE_BY_SQUARING = True


# Streaming multiprocessors of the GPU the shape classes below were written for (H100 SXM: 132,
# H200: 132); `_sequential_value_block` asks for the device's own count when there is one.
DEFAULT_SM_COUNT = 132
# Value-block width of the sequential kernels when B H cdiv(V, 32) programs would leave SMs idle,
# or None to keep 32 everywhere. 16-wide blocks crashed with block pointers (Triton 3.6) and run
# since the port to plain pointers (all 12 few-heads variants of gpu/kernel_grid.py on an H100,
# output identical), but gave no gain where the class was meant to help: 2,8192,8,128 (64
# programs on 132 SMs) 0.456 -> 0.456 ms forward, 2.327 -> 2.332 ms fwd+bwd (gpu/README.md,
# 2026-11-23). So None, until a shape of the class shows a gain.
NARROW_VALUE_BLOCK: int | None = None


def _sm_count(device: torch.device | None) -> int:
    if device is not None and device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return DEFAULT_SM_COUNT


def _value_block(K: int, V: int) -> int:
    # narrow value blocks: more programs in the sequential kernels, and the (BK, BV) state plus
    # the (BT, BK) tiles still (mostly) fit in registers. 32 even for V <= 16 (masked): 16-wide
    # blocks crashed with an illegal memory access on an H100 and an H200 with block pointers
    # (Triton 3.6); they run since the port, but were no faster (NARROW_VALUE_BLOCK)
    return 32


def _sequential_value_block(B: int, H: int, K: int, V: int, device: torch.device | None = None) -> int:
    """Value-block width of the sequential kernels (`_fwd_kernel`, `_bwd_state_kernel`) and of the
    chunk-parallel kernels that share their grid (`_output_kernel`, `_bwd_local_kernel`).

    Shape classes: the sequential kernels run B H cdiv(V, BV) programs, each walking all T / 64
    chunks, so their time is T / 64 chunk steps whatever B H is, as long as the programs fit the
    SMs at once. With 32-wide blocks, B H = 16 and V = 128 make 64 programs on 132 SMs: half the
    GPU idles through the longest kernel of the op (the (2, 8192, 8, 128) shape: 0.91x of fla's
    fwd+bwd in the issue, 1.15x in the grid call of 2026-11-23). There, and only there, narrower
    blocks double the programs at the price of reading the (64, K) key tiles twice as often;
    measured, that bought nothing, so NARROW_VALUE_BLOCK is None."""
    BV = _value_block(K, V)
    if NARROW_VALUE_BLOCK and B * H * triton.cdiv(V, BV) < _sm_count(device):
        return min(BV, NARROW_VALUE_BLOCK)
    return BV


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
    BV = _sequential_value_block(B, H, K, V, dev)
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
    BT, BK, BV = CHUNK, block_size(K), _sequential_value_block(B, H, K, V, q.device)
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


def triton_chunk_delta_rule(
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
