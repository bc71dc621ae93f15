"""The Titans linear memory in Triton: the autograd Function and the public op
`triton_chunk_titans_memory`. The kernels: `gates.py` (the gates' in-chunk products a, b, Gamma
and the chunk ends, and their gradients to alpha and eta), `chunk_fwd.py` (forward: a sequential
state pass, then the outputs chunk-parallel) and `chunk_bwd.py` (backward: chunk-parallel,
sequential, chunk-parallel). The kernels compute the same function as
`ltm.ops.titans.chunk_titans_memory` with the linear memory, chunks counted from the first token
(a state entering mid-chunk is `ltm.ops.titans`' business), tested against the token loop.
"""
from __future__ import annotations

import torch

from ltm.kernels.common import block_size, cdiv, check_dtype, check_head_dim, dot_precision, nan_buffer
from ltm.kernels.titans.chunk_bwd import (_titans_bwd_keys_kernel, _titans_bwd_local_kernel,
                                          _titans_bwd_state_kernel)
from ltm.kernels.titans.chunk_fwd import _titans_output_kernel, _titans_states_kernel
from ltm.kernels.titans.gates import triton_chunk_gates, triton_chunk_gates_bwd
from ltm.ops.titans.memory import TRITON_CHUNK_SIZES as CHUNK_SIZES


def _launch_options(K: int, V: int) -> dict:
    # A program holds W and S (forward) and their gradients (backward), [K, V] float32 each. Two
    # stages let the sequential kernels load the next chunk's tokens while multiplying this one's:
    # forward+backward 6.49 -> 6.33 ms at 8 x 2048 x 12 x 64 and 9.16 -> 8.16 ms at 2 x 8192 x 12 x
    # 64 (chunk 16, H100, 4 warps; 8 warps was slower at both: 6.84 and 9.62 ms with one stage).
    return {"num_warps": 8 if max(K, V) > 64 else 4, "num_stages": 2}


# The op is two custom operators, forward and backward, opaque to torch.compile: traced, the gate
# products' cumulative products became scan kernels for Inductor to compile in every layer (68 s
# for a 2-layer model's first step on an H100, minutes for 12). Inside, the Triton launches run
# eagerly. Options travel as plain scalars (clip 0 = no clipping); outputs a call does not need
# are empty tensors. The forward's gate products go to the backward (Gamma is [B, H, T, BT] float32,
# 50 MB a layer at 8 x 2048 x 12 and chunk 64) instead of being made again there: the recompute
# was 12 of the 24 `_gates_fwd` launches of a training step, 1.45 of its 68.6 ms (H100, linear
# memory, records/lab/titans-train-profile-h100-2026-12-06.json).
@torch.library.custom_op("ltm::titans_memory_fwd", mutates_args=())
def _titans_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, theta: torch.Tensor,
                alpha: torch.Tensor, eta: torch.Tensor, w0: torch.Tensor, s0: torch.Tensor,
                chunk: int, clip: float, final: bool
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                           torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                           torch.Tensor, torch.Tensor]:
    """o, the final memory and momentum (empty unless `final`), and for the backward each chunk's
    entering memory and momentum [B, H, NT, K, V], g [B, H, NT * BT] and the six gate products
    (`triton_chunk_gates`)."""
    B, T, H, K = q.shape
    V, NT = v.shape[-1], cdiv(T, chunk)
    f32, dev = torch.float32, q.device
    o = v.new_empty(v.shape)
    w_states = nan_buffer((B, H, NT, K, V), f32, dev)
    s_states = nan_buffer((B, H, NT, K, V), f32, dev)
    g = nan_buffer((B, H, NT * chunk), f32, dev)
    wt = torch.empty((B, H, K, V) if final else (0,), dtype=f32, device=dev)
    st = torch.empty_like(wt)
    gates = triton_chunk_gates(alpha, eta, chunk)
    a, b, gamma, ends, w_last, p_last = gates
    dims = dict(H=H, K=K, V=V, BT=chunk, BK=block_size(K), BV=block_size(V),
                PRECISION=dot_precision(q.dtype, K), **_launch_options(K, V))
    # 8 warps, each chunk's inputs loaded a chunk ahead (together, one H200, b9b9813): 0.113 ->
    # 0.100 ms at 8 x 2048 x 12 x 64 and 0.390 -> 0.364 ms at 2 x 8192 x 12 x 64, chunk 64
    _titans_states_kernel[(B * H,)](
        k, v, theta, ends, w_last, p_last, w0, s0, w_states, s_states, g, wt, st, T, NT,
        clip or 1.0, USE_CLIP=clip > 0, STORE_FINAL=final, **dict(dims, num_warps=8))
    _titans_output_kernel[(NT, B * H)](q, k, v, a, b, gamma, w_states, s_states, g, o, T, NT,
                                       **dims)
    return o, wt, st, w_states, s_states, g, *gates


@_titans_fwd.register_fake
def _(q, k, v, theta, alpha, eta, w0, s0, chunk, clip, final):
    B, T, H, K = q.shape
    V, NT = v.shape[-1], cdiv(T, chunk)
    state = q.new_empty((B, H, K, V) if final else (0,), dtype=torch.float32)
    states = q.new_empty((B, H, NT, K, V), dtype=torch.float32)
    rows = q.new_empty((B, H, NT * chunk), dtype=torch.float32)
    gates = (rows, torch.empty_like(rows), q.new_empty((B, H, NT * chunk, chunk), dtype=torch.float32),
             q.new_empty((B, H, NT, 3), dtype=torch.float32), torch.empty_like(rows),
             torch.empty_like(rows))
    return (v.new_empty(v.shape), state, torch.empty_like(state), states, torch.empty_like(states),
            torch.empty_like(rows), *gates)


@torch.library.custom_op("ltm::titans_memory_bwd", mutates_args=())
def _titans_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, theta: torch.Tensor,
                alpha: torch.Tensor, eta: torch.Tensor, w_states: torch.Tensor,
                s_states: torch.Tensor, g: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                gamma: torch.Tensor, ends: torch.Tensor, w_last: torch.Tensor,
                p_last: torch.Tensor, do: torch.Tensor, dwt: torch.Tensor, dst: torch.Tensor,
                chunk: int, clip: float
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                           torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of q, k, v, theta, alpha, eta, w0 and s0 (see chunk_bwd.py)."""
    B, T, H, K = q.shape
    V, NT = v.shape[-1], cdiv(T, chunk)
    f32, dev = torch.float32, q.device
    gates = (a, b, gamma, ends, w_last, p_last)
    da, db, dgamma, dends, dw_last, dp_last = (torch.empty_like(x) for x in gates)
    dq, dk, dv = (x.new_empty(x.shape) for x in (q, k, v))
    dtheta = torch.empty((B, T, H), dtype=f32, device=dev)
    dw0 = torch.empty((B, H, K, V), dtype=f32, device=dev)
    ds0 = torch.empty_like(dw0)
    rows = NT * chunk
    delta, ddelta = (nan_buffer((B, H, rows, V), f32, dev) for _ in range(2))
    dk_local = nan_buffer((B, H, rows, K), f32, dev)
    dg_local = nan_buffer((B, H, rows), f32, dev)
    dws, dss = (nan_buffer((B, H, NT, K, V), f32, dev) for _ in range(2))
    dims = dict(H=H, K=K, V=V, BT=chunk, BK=block_size(K), BV=block_size(V),
                PRECISION=dot_precision(q.dtype, K), **_launch_options(K, V))
    do = do.contiguous()
    _titans_bwd_local_kernel[(NT, B * H)](
        q, k, v, do, a, b, gamma, w_states, s_states, g, dq, da, db, dgamma, delta, ddelta,
        dg_local, dk_local, dws, dss, T, NT, **dims)
    use_dht = dwt.numel() > 0
    # 8 warps: at 4 its registers spill inside the sequential loop (ptxas for sm_90, K = V = 64,
    # bfloat16, chunk 64: 452-476 bytes a thread; 0-8 at 8 before its inputs were loaded a chunk
    # ahead, 204 since, which still ran faster: 0.771 -> 0.663 ms at 2 x 8192 x 12 x 64, H200)
    _titans_bwd_state_kernel[(B * H,)](
        k, theta, ends, w_last, p_last, g, delta, dg_local, dws, dss, dwt.contiguous(),
        dst.contiguous(), dw0, ds0, T, NT, clip or 1.0, USE_CLIP=clip > 0, USE_DHT=use_dht,
        **dict(dims, num_warps=8))
    _titans_bwd_keys_kernel[(NT, B * H)](
        k, theta, w_last, p_last, w_states, s_states, g, delta, ddelta, dg_local, dk_local, dws,
        dss, dk, dv, dtheta, dw_last, dp_last, dends, T, NT, clip or 1.0, USE_CLIP=clip > 0,
        **dims)
    dalpha, deta = triton_chunk_gates_bwd(alpha, eta, chunk, (da, db, dgamma, dends, dw_last,
                                                              dp_last), gamma)
    return (dq, dk, dv, dtheta.to(theta.dtype), dalpha, deta, dw0, ds0)


@_titans_bwd.register_fake
def _(q, k, v, theta, alpha, eta, w_states, s_states, g, a, b, gamma, ends, w_last, p_last, do,
      dwt, dst, chunk, clip):
    B, T, H, K = q.shape
    state = q.new_empty((B, H, K, v.shape[-1]), dtype=torch.float32)
    return (*(x.new_empty(x.shape) for x in (q, k, v, theta, alpha, eta)), state,
            torch.empty_like(state))


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, theta, alpha, eta, _, _, chunk, clip, final = inputs
    ctx.save_for_backward(q, k, v, theta, alpha, eta, *output[3:])
    ctx.options = (chunk, clip, final)


def _backward(ctx, do, dwt, dst, *_):
    q, k, v, theta, alpha, eta, *states_and_gates = ctx.saved_tensors
    chunk, clip, final = ctx.options
    if not final or (dwt is None and dst is None):
        dwt = dst = q.new_empty(0, dtype=torch.float32)
    else:
        zeros = torch.zeros((q.shape[0], q.shape[2], k.shape[-1], v.shape[-1]),
                            dtype=torch.float32, device=q.device)
        dwt, dst = (zeros if x is None else x for x in (dwt, dst))
    grads = _titans_bwd(q, k, v, theta, alpha, eta, *states_and_gates, do, dwt, dst, chunk, clip)
    return (*grads, None, None, None)


_titans_fwd.register_autograd(_backward, setup_context=_setup_context)


def _check(q, k, v, theta, alpha, eta, w0, s0, chunk_size) -> None:
    if q.dim() != 4 or q.shape[1] < 1 or k.shape != q.shape:
        raise ValueError(f"q and k must be [B, T, H, K] alike with T >= 1, got {tuple(q.shape)} "
                         f"and {tuple(k.shape)}")
    B, T, H, K = q.shape
    if v.dim() != 4 or tuple(v.shape[:3]) != (B, T, H):
        raise ValueError(f"v must be [B, T, H, V] with B, T, H = {(B, T, H)}, got {tuple(v.shape)}")
    for name, x in (("theta", theta), ("alpha", alpha), ("eta", eta)):
        if tuple(x.shape) != (B, T, H):
            raise ValueError(f"{name} must be [B, T, H] = {(B, T, H)}, got {tuple(x.shape)}")
    for name, x in (("k", k), ("v", v)):
        check_dtype(name, x, q.dtype)
    check_head_dim("q/k", K)
    check_head_dim("v", v.shape[-1])
    for name, x in (("w0", w0), ("s0", s0)):
        if tuple(x.shape) != (B, H, K, v.shape[-1]):
            raise ValueError(f"{name} must be [B, H, K, V] = {(B, H, K, v.shape[-1])}, got "
                             f"{tuple(x.shape)}")
    if chunk_size not in CHUNK_SIZES:
        raise ValueError(f"chunk_size must be one of {CHUNK_SIZES} for the Triton kernel, got "
                         f"{chunk_size!r}; use kernel 'torch'")
    if chunk_size > 32 and max(K, v.shape[-1]) > 64 and q.dtype != torch.bfloat16:
        # float32 tiles of a 128-wide state exceed an H100's shared memory (331 KB asked)
        raise ValueError(f"chunk_size {chunk_size} with head size {max(K, v.shape[-1])} runs in "
                         f"bfloat16 only ({q.dtype} tiles exceed shared memory); use chunk_size "
                         "<= 32, bfloat16 or kernel 'torch'")


def triton_chunk_titans_memory(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    theta: torch.Tensor,
    alpha: torch.Tensor,
    eta: torch.Tensor,
    w0: torch.Tensor,
    s0: torch.Tensor,
    *,
    chunk_size: int,
    grad_clip: float | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The Titans linear memory over a sequence whose first token starts a chunk.

    q, k: [B, T, H, K]; v: [B, T, H, V] (one dtype); theta, alpha, eta: [B, T, H]; w0, s0: the
    memory and its momentum before the first token, [B, H, K, V] (float32; differentiable).
    Returns o [B, T, H, V] in v's dtype and, when `output_final_state`, the memory and momentum
    after the last token [B, H, K, V] float32 (else None, None).
    """
    _check(q, k, v, theta, alpha, eta, w0, s0, chunk_size)
    q, k, v, theta, alpha, eta = (x.contiguous() for x in (q, k, v, theta, alpha, eta))
    o, wt, st, *_ = _titans_fwd(q, k, v, theta, alpha, eta, w0.float().contiguous(),
                                s0.float().contiguous(), chunk_size, float(grad_clip or 0.0),
                                output_final_state)
    return (o, wt, st) if output_final_state else (o, None, None)
