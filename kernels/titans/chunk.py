"""The Titans linear memory in Triton: the gate products (PyTorch), the autograd Function and the
public op `triton_chunk_titans_memory`. The kernels: `chunk_fwd.py` (forward) and `chunk_bwd.py`
(backward), one program per (batch, head) each, sequential over the chunks.

The gates' in-chunk products (a, b, Gamma, the chunk ends; see `ltm.ops.titans.chunk`) are small
([B, H, T, BT] at most) and made here by PyTorch, whose autograd also takes their gradients, which
the backward kernel returns, to alpha and eta: no division by a cumulative product anywhere, so
alpha = 1 or eta = 0 stays exact. The kernels compute the same function as
`ltm.ops.titans.chunk_titans_memory` with the linear memory, chunks counted from the first token
(a state entering mid-chunk is `ltm.ops.titans`' business), tested against the token loop.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ltm.kernels.common import block_size, cdiv, check_dtype, check_head_dim, dot_precision, nan_buffer
from ltm.kernels.titans.chunk_bwd import _titans_bwd_kernel
from ltm.kernels.titans.chunk_fwd import _titans_fwd_kernel
from ltm.ops.titans.chunk import transfer
from ltm.ops.titans.memory import TRITON_CHUNK_SIZES as CHUNK_SIZES


def chunk_gates(alpha: torch.Tensor, eta: torch.Tensor, chunk: int) -> tuple[torch.Tensor, ...]:
    """The in-chunk gate products for alpha, eta [B, T, H], float32, chunks of `chunk` tokens from
    the first (the last one padded): a, b [B, H, NT * BT]; Gamma [B, H, NT * BT, BT]; the chunk
    ends (a, b, E at the chunk's last token) [B, H, NT, 3]; Gamma's and P's rows at that token
    [B, H, NT * BT]."""
    B, T, H = alpha.shape
    NT = cdiv(T, chunk)
    # pads forget nothing and keep all momentum; their rows are never read
    f = F.pad((1 - alpha.float()).transpose(1, 2), (0, NT * chunk - T), value=1.0)
    e = F.pad(eta.float().transpose(1, 2), (0, NT * chunk - T), value=1.0)
    f, e = f.view(B, H, NT, chunk), e.view(B, H, NT, chunk)
    a, E = f.cumprod(-1), e.cumprod(-1)
    D, P = transfer(f), transfer(e)  # (B, H, NT, BT, BT)
    b = (D @ E[..., None])[..., 0]
    gamma = D @ P
    chunks = torch.arange(NT, device=alpha.device)
    last = (T - 1 - chunks * chunk).clamp(max=chunk - 1)  # each chunk's last token
    ends = torch.stack([x[:, :, chunks, last] for x in (a, b, E)], -1)
    w_last, p_last = gamma[:, :, chunks, last], P[:, :, chunks, last]  # (B, H, NT, BT)
    return (a.reshape(B, H, -1), b.reshape(B, H, -1), gamma.reshape(B, H, -1, chunk),
            ends.contiguous(), w_last.reshape(B, H, -1), p_last.reshape(B, H, -1))


def _launch_options(K: int, V: int) -> dict:
    # a program holds W and S (forward) and their gradients (backward), [K, V] float32 each
    return {"num_warps": 8 if max(K, V) > 64 else 4, "num_stages": 1}


class _TitansChunk(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, theta, a, b, gamma, ends, w_last, p_last, w0, s0, chunk, clip,
                output_final_state):
        B, T, H, K = q.shape
        V, NT = v.shape[-1], cdiv(T, chunk)
        f32, dev = torch.float32, q.device
        backward = any(ctx.needs_input_grad)
        o = torch.empty_like(v)
        w_states = nan_buffer((B, H, NT, K, V), f32, dev) if backward else None
        s_states = nan_buffer((B, H, NT, K, V), f32, dev) if backward else None
        wt = torch.empty((B, H, K, V), dtype=f32, device=dev) if output_final_state else None
        st = torch.empty_like(wt) if output_final_state else None
        precision = dot_precision(q.dtype, K)
        _titans_fwd_kernel[(B * H,)](
            q, k, v, theta, a, b, gamma, ends, w_last, p_last, w0, s0, o, w_states, s_states, wt,
            st, T, NT, clip or 1.0, H=H, K=K, V=V, BT=chunk, BK=block_size(K), BV=block_size(V),
            USE_CLIP=clip is not None, USE_H0=True, STORE_STATES=backward,
            STORE_FINAL=output_final_state, PRECISION=precision, **_launch_options(K, V))
        ctx.save_for_backward(q, k, v, theta, a, b, gamma, ends, w_last, p_last, w_states, s_states)
        ctx.options = (chunk, clip, precision)
        return o, wt, st

    @staticmethod
    def backward(ctx, do, dwt, dst):
        q, k, v, theta, a, b, gamma, ends, w_last, p_last, w_states, s_states = ctx.saved_tensors
        chunk, clip, precision = ctx.options
        B, T, H, K = q.shape
        V, NT = v.shape[-1], cdiv(T, chunk)
        f32, dev = torch.float32, q.device
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dtheta = torch.empty((B, T, H), dtype=f32, device=dev)
        da, db, dw_last, dp_last = (torch.empty_like(x) for x in (a, b, w_last, p_last))
        dgamma, dends = torch.empty_like(gamma), torch.empty_like(ends)
        dw0 = torch.empty((B, H, K, V), dtype=f32, device=dev)
        ds0 = torch.empty_like(dw0)
        use_dht = dwt is not None or dst is not None
        if use_dht:
            dwt = torch.zeros_like(dw0) if dwt is None else dwt.contiguous()
            dst = torch.zeros_like(dw0) if dst is None else dst.contiguous()
        _titans_bwd_kernel[(B * H,)](
            q, k, v, theta, a, b, gamma, ends, w_last, p_last, w_states, s_states,
            do.contiguous(), dwt, dst, dq, dk, dv, dtheta, da, db, dgamma, dends, dw_last,
            dp_last, dw0, ds0, T, NT, clip or 1.0, H=H, K=K, V=V, BT=chunk, BK=block_size(K),
            BV=block_size(V), USE_CLIP=clip is not None, USE_DHT=use_dht, PRECISION=precision,
            **_launch_options(K, V))
        return (dq, dk, dv, dtheta.to(theta.dtype), da, db, dgamma, dends, dw_last, dp_last,
                dw0, ds0, None, None, None)


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
    gates = chunk_gates(alpha, eta, chunk_size)
    q, k, v, theta = (x.contiguous() for x in (q, k, v, theta))
    return _TitansChunk.apply(q, k, v, theta, *gates, w0.float().contiguous(),
                              s0.float().contiguous(), chunk_size, grad_clip, output_final_state)
