"""DeltaNet's input path fused in Triton: causal depthwise convolution of the packed q, k, v
projection, SiLU, and L2 normalisation per head of q and k; forward and backward.

    p[b, t, c] = sum_j w[j, c] x[b, t - W + 1 + j, c]     (x is zero before t = 0)
    u = silu(p);   q, k, v = the three thirds of u's channels, q and k divided per head by
    max(||u_head||, eps)

q, k and v come out as three contiguous tensors, so the delta rule reads them without a copy and
their gradients come back without being stacked into one.

Unfused, these are a padded copy, W shifted multiply-adds, the activation and a normalisation,
each a pass over the (B, T, 3C) activations and again in the backward; on an H100 they took 12
of the 65 ms of a compiled DeltaNet training step (gpu/profile_train.py deltanet --compile).
Here each program owns BT tokens of one head's channels and reads its inputs once per pass. The
backward recomputes p and u rather than saving them, then writes the gradient of p once and
reads it back shifted for the input's gradient. Tested against `ltm.model.mixers.ShortConv`
followed by `F.normalize`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ltm.kernels.common import block_size, cdiv, nan_buffer, rounded

# Tokens per program; the convolution reads W - 1 tokens before them again.
TOKENS = 64


@triton.jit
def _preactivation(x, w_ptr, i_b, rows, cols, in_head, T, C: tl.constexpr, W: tl.constexpr,
                   BT: tl.constexpr, BD: tl.constexpr):
    """(BT, BD) float32 p for the given rows (tokens) and columns (channels); 0 outside T."""
    p = tl.zeros([BT, BD], dtype=tl.float32)
    for j in tl.static_range(W):
        src = rows - (W - 1) + j
        m = ((src >= 0) & (src < T))[:, None] & in_head[None, :]
        xj = tl.load(x + (i_b * T + src)[:, None] * C + cols[None, :], mask=m, other=0.)
        wj = tl.load(w_ptr + j * C + cols, mask=in_head, other=0.)
        p += xj.to(tl.float32) * wj.to(tl.float32)[None, :]
    return p


@triton.jit
def _part_offsets(i_b, i_c, rows, T, C: tl.constexpr, BD: tl.constexpr, D: tl.constexpr):
    """Which third (0 q, 1 k, 2 v) head i_c is in, and the offsets of its (BT, BD) tile there."""
    part = (i_c * D) // (C // 3)
    cols = i_c * D - part * (C // 3) + tl.arange(0, BD)
    return part, (i_b * T + rows)[:, None] * (C // 3) + cols[None, :]


@triton.jit
def _fwd_kernel(x, w, q, k, v, T, C: tl.constexpr, W: tl.constexpr, EPS: tl.constexpr,
                BT: tl.constexpr, BD: tl.constexpr, D: tl.constexpr):
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = i_t * BT + tl.arange(0, BT)
    cols = i_c * D + tl.arange(0, BD)
    # a head is D channels; BD >= D is the power-of-two tile holding it
    in_head = tl.arange(0, BD) < D
    p = _preactivation(x, w, i_b, rows, cols, in_head, T, C, W, BT, BD)
    u = p * tl.sigmoid(p)
    part, offsets = _part_offsets(i_b, i_c, rows, T, C, BD, D)
    m = (rows < T)[:, None] & in_head[None, :]
    if part < 2:
        norm = tl.sqrt(tl.sum(tl.where(in_head[None, :], u * u, 0.), axis=1))
        u = u / tl.maximum(norm, EPS)[:, None]
    if part == 0:
        tl.store(q + offsets, rounded(u, q.dtype.element_ty), mask=m)
    elif part == 1:
        tl.store(k + offsets, rounded(u, k.dtype.element_ty), mask=m)
    else:
        tl.store(v + offsets, rounded(u, v.dtype.element_ty), mask=m)


@triton.jit
def _dpre(x, w, g, i_b, rows, cols, in_head, T, C: tl.constexpr, norm, W: tl.constexpr, EPS: tl.constexpr,
          BT: tl.constexpr, BD: tl.constexpr):
    """(BT, BD) float32 gradient of p at the given rows from g, the gradient of the output there;
    `norm`: whether these channels are L2-normalised."""
    p = _preactivation(x, w, i_b, rows, cols, in_head, T, C, W, BT, BD)
    sig = tl.sigmoid(p)
    u = p * sig
    if norm:
        size = tl.sqrt(tl.sum(tl.where(in_head[None, :], u * u, 0.), axis=1))
        n = tl.maximum(size, EPS)
        y = u / n[:, None]
        # below eps the norm is the constant eps: only the division's own term remains
        radial = tl.where(size > EPS, tl.sum(y * g, axis=1), 0.)
        g = (g - y * radial[:, None]) / n[:, None]
    return g * sig * (1. + p * (1. - sig))


@triton.jit
def _dpre_kernel(x, w, dq, dk, dv, dp, T, C: tl.constexpr, W: tl.constexpr, EPS: tl.constexpr,
                 BT: tl.constexpr, BD: tl.constexpr, D: tl.constexpr):
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = i_t * BT + tl.arange(0, BT)
    cols = i_c * D + tl.arange(0, BD)
    in_head = tl.arange(0, BD) < D
    m = (rows < T)[:, None] & in_head[None, :]
    part, offsets = _part_offsets(i_b, i_c, rows, T, C, BD, D)
    if part == 0:
        g = tl.load(dq + offsets, mask=m, other=0.).to(tl.float32)
    elif part == 1:
        g = tl.load(dk + offsets, mask=m, other=0.).to(tl.float32)
    else:
        g = tl.load(dv + offsets, mask=m, other=0.).to(tl.float32)
    g = _dpre(x, w, g, i_b, rows, cols, in_head, T, C, part < 2, W, EPS, BT, BD)
    tl.store(dp + (i_b * T + rows)[:, None] * C + cols[None, :], rounded(g, dp.dtype.element_ty), mask=m)


@triton.jit
def _bwd_kernel(x, w, dp, dx, dw_part, T, C: tl.constexpr, W: tl.constexpr, BT: tl.constexpr,
                BD: tl.constexpr, D: tl.constexpr):
    # dx[s] = sum_j w[j] dp[s + W - 1 - j]: reads dp up to W - 1 tokens past this program's rows,
    # which is why dp is a pass of its own (recomputing it for each shift took 0.66 against 0.29 ms
    # per layer of the GPU profile on an H100)
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = i_t * BT + tl.arange(0, BT)
    cols = i_c * D + tl.arange(0, BD)
    in_head = tl.arange(0, BD) < D
    b_dx = tl.zeros([BT, BD], dtype=tl.float32)
    for j in tl.static_range(W):
        src = rows + (W - 1 - j)
        ms = (src < T)[:, None] & in_head[None, :]
        dp_j = tl.load(dp + (i_b * T + src)[:, None] * C + cols[None, :], mask=ms, other=0.).to(tl.float32)
        wj = tl.load(w + j * C + cols, mask=in_head, other=0.).to(tl.float32)
        b_dx += dp_j * wj[None, :]
    m = (rows < T)[:, None] & in_head[None, :]
    tl.store(dx + (i_b * T + rows)[:, None] * C + cols[None, :], rounded(b_dx, dx.dtype.element_ty), mask=m)
    # dw[j] = sum_t x[t - W + 1 + j] dp[t], this program's share
    g = tl.load(dp + (i_b * T + rows)[:, None] * C + cols[None, :], mask=m, other=0.).to(tl.float32)
    part = dw_part + ((i_b * tl.num_programs(0) + i_t) * W) * C + cols
    for j in tl.static_range(W):
        src = rows - (W - 1) + j
        ms = ((src >= 0) & (src < T))[:, None] & in_head[None, :]
        xj = tl.load(x + (i_b * T + src)[:, None] * C + cols[None, :], mask=ms, other=0.)
        tl.store(part + j * C, tl.sum(xj.to(tl.float32) * g, axis=0), mask=in_head)


def _grid(B: int, T: int, C: int, head_dim: int) -> tuple[int, int, int]:
    return (cdiv(T, TOKENS), C // head_dim, B)


class ShortConvQKVFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, weight, head_dim, eps):
        B, T, C = x.shape
        W = weight.shape[0]
        q, k, v = (nan_buffer((B, T, C // 3), x.dtype, x.device) for _ in range(3))
        _fwd_kernel[_grid(B, T, C, head_dim)](x, weight, q, k, v, T, C, W, eps, TOKENS,
                                              block_size(head_dim), head_dim)
        ctx.save_for_backward(x, weight)
        ctx.head_dim, ctx.eps = head_dim, eps
        return q, k, v

    @staticmethod
    def backward(ctx, dq, dk, dv):
        x, weight = ctx.saved_tensors
        B, T, C = x.shape
        W = weight.shape[0]
        grid = _grid(B, T, C, ctx.head_dim)
        BD = block_size(ctx.head_dim)
        dq, dk, dv = (torch.zeros_like(x[..., :C // 3]) if g is None else g.contiguous()
                      for g in (dq, dk, dv))
        # in x's dtype: read back W times below, it is the largest stream of the backward (bf16
        # instead of float32 adds one rounding of 2^-9 before sums of W products)
        dp = nan_buffer((B, T, C), x.dtype, x.device)
        _dpre_kernel[grid](x, weight, dq, dk, dv, dp, T, C, W, ctx.eps, TOKENS, BD, ctx.head_dim)
        dx = nan_buffer((B, T, C), x.dtype, x.device)
        dw_part = nan_buffer((B * grid[0], W, C), torch.float32, x.device)
        _bwd_kernel[grid](x, weight, dp, dx, dw_part, T, C, W, TOKENS, BD, ctx.head_dim)
        return dx, dw_part.sum(0).to(weight.dtype), None, None


def short_conv_qkv(
    x: torch.Tensor,
    weight: torch.Tensor,
    head_dim: int,
    eps: float = 1e-12,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v from the packed projection x: silu(causal depthwise conv of x) split in thirds, q
    and k divided per head by their L2 norm (at least eps, as `F.normalize`); differentiable in x
    and weight. Same result as `ltm.model.mixers.ShortConv` then `F.normalize` of q and k.

    Args:
        x: [B, T, C] (q, k, v channels in that order), float32, bfloat16 or float16; C a multiple
            of 3 * head_dim.
        weight: [W, C], tap j multiplying x[t - W + 1 + j]; cast to x's dtype.
    Returns:
        q, k, v: each [B, T, C // 3], contiguous, in x's dtype (computed in float32).
    """
    if x.dim() != 3:
        raise ValueError(f"x must be [B, T, C], got shape {tuple(x.shape)}")
    B, T, C = x.shape
    if weight.dim() != 2 or weight.shape[1] != C:
        raise ValueError(f"weight must be [W, C] with C = {C}, got {tuple(weight.shape)}")
    if head_dim < 1 or C % (3 * head_dim):
        raise ValueError(f"C = {C} must be a multiple of 3 * head_dim = {3 * head_dim}")
    return ShortConvQKVFunction.apply(x.contiguous(), weight.to(x.dtype).contiguous(), head_dim,
                                      float(eps))
