"""DeltaNet's input path fused in Triton: causal depthwise convolution, SiLU, and L2 normalisation
per head of the leading (query and key) channels; forward and backward.

    p[b, t, c] = sum_j w[j, c] x[b, t - W + 1 + j, c]     (x is zero before t = 0)
    u = silu(p);   y = u / max(||u_head||, eps) for the first `norm_channels` channels, else u

Unfused, these are a padded copy, W shifted multiply-adds, the activation and a normalisation,
each a pass over the (B, T, 3C) activations and again in the backward; on an H100 they took 12
of the 65 ms of a compiled DeltaNet training step (gpu/profile_train.py deltanet --compile).
Here each program owns BT tokens of one head's channels and reads its inputs once per pass. The
backward recomputes p and u rather than saving them, then writes the gradient of p once and
reads it back shifted for the input's gradient. Tested against `ltm.mixers.ShortConv`
followed by `F.normalize`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ltm.kernels.common import block_size, nan_buffer

# Tokens per program; the convolution reads W - 1 tokens before them again.
TOKENS = 64


@triton.jit
def _preactivation(x, w_ptr, i_b, rows, cols, in_head, T, C, W: tl.constexpr, BT: tl.constexpr,
                   BD: tl.constexpr):
    """(BT, BD) float32 p for the given rows (tokens) and columns (channels); 0 outside T."""
    mask_c = in_head & (cols < C)
    p = tl.zeros([BT, BD], dtype=tl.float32)
    for j in tl.static_range(W):
        src = rows - (W - 1) + j
        m = ((src >= 0) & (src < T))[:, None] & mask_c[None, :]
        xj = tl.load(x + (i_b * T + src)[:, None] * C + cols[None, :], mask=m, other=0.)
        wj = tl.load(w_ptr + j * C + cols, mask=mask_c, other=0.)
        p += xj.to(tl.float32) * wj.to(tl.float32)[None, :]
    return p


@triton.jit
def _fwd_kernel(x, w, y, T, C, NORM_C, W: tl.constexpr, EPS: tl.constexpr,
                BT: tl.constexpr, BD: tl.constexpr, D: tl.constexpr):
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = i_t * BT + tl.arange(0, BT)
    cols = i_c * D + tl.arange(0, BD)
    # a head is D channels; BD >= D is the power-of-two tile holding it
    in_head = tl.arange(0, BD) < D
    p = _preactivation(x, w, i_b, rows, cols, in_head, T, C, W, BT, BD)
    u = p * tl.sigmoid(p)
    if i_c * D < NORM_C:
        norm = tl.sqrt(tl.sum(tl.where(in_head[None, :], u * u, 0.), axis=1))
        u = u / tl.maximum(norm, EPS)[:, None]
    m = (rows < T)[:, None] & in_head[None, :]
    tl.store(y + (i_b * T + rows)[:, None] * C + cols[None, :], u.to(y.dtype.element_ty), mask=m)


@triton.jit
def _dpre(x, w, dy, i_b, rows, cols, in_head, T, C, norm, W: tl.constexpr, EPS: tl.constexpr,
          BT: tl.constexpr, BD: tl.constexpr):
    """(BT, BD) float32 gradient of p at the given rows, from dy (0 outside T); `norm`: whether
    these channels are L2-normalised."""
    p = _preactivation(x, w, i_b, rows, cols, in_head, T, C, W, BT, BD)
    m = ((rows >= 0) & (rows < T))[:, None] & in_head[None, :]
    g = tl.load(dy + (i_b * T + rows)[:, None] * C + cols[None, :], mask=m, other=0.).to(tl.float32)
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
def _dpre_kernel(x, w, dy, dp, T, C, NORM_C, W: tl.constexpr, EPS: tl.constexpr,
                 BT: tl.constexpr, BD: tl.constexpr, D: tl.constexpr):
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = i_t * BT + tl.arange(0, BT)
    cols = i_c * D + tl.arange(0, BD)
    in_head = tl.arange(0, BD) < D
    g = _dpre(x, w, dy, i_b, rows, cols, in_head, T, C, i_c * D < NORM_C, W, EPS, BT, BD)
    m = (rows < T)[:, None] & in_head[None, :]
    tl.store(dp + (i_b * T + rows)[:, None] * C + cols[None, :], g, mask=m)


@triton.jit
def _bwd_kernel(x, w, dp, dx, dw_part, T, C, W: tl.constexpr, BT: tl.constexpr,
                BD: tl.constexpr, D: tl.constexpr):
    # dx[s] = sum_j w[j] dp[s + W - 1 - j]: reads dp up to W - 1 tokens past this program's rows,
    # which is why dp is a pass of its own (recomputing it per shift took 5x longer on an H100)
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = i_t * BT + tl.arange(0, BT)
    cols = i_c * D + tl.arange(0, BD)
    in_head = tl.arange(0, BD) < D
    b_dx = tl.zeros([BT, BD], dtype=tl.float32)
    for j in tl.static_range(W):
        src = rows + (W - 1 - j)
        ms = (src < T)[:, None] & in_head[None, :]
        dp_j = tl.load(dp + (i_b * T + src)[:, None] * C + cols[None, :], mask=ms, other=0.)
        wj = tl.load(w + j * C + cols, mask=in_head, other=0.).to(tl.float32)
        b_dx += dp_j * wj[None, :]
    m = (rows < T)[:, None] & in_head[None, :]
    tl.store(dx + (i_b * T + rows)[:, None] * C + cols[None, :], b_dx.to(dx.dtype.element_ty), mask=m)
    # dw[j] = sum_t x[t - W + 1 + j] dp[t], this program's share
    g = tl.load(dp + (i_b * T + rows)[:, None] * C + cols[None, :], mask=m, other=0.)
    part = dw_part + ((i_b * tl.num_programs(0) + i_t) * W) * C + cols
    for j in tl.static_range(W):
        src = rows - (W - 1) + j
        ms = ((src >= 0) & (src < T))[:, None] & in_head[None, :]
        xj = tl.load(x + (i_b * T + src)[:, None] * C + cols[None, :], mask=ms, other=0.)
        tl.store(part + j * C, tl.sum(xj.to(tl.float32) * g, axis=0), mask=in_head)


def _grid(B: int, T: int, C: int, head_dim: int) -> tuple[int, int, int]:
    return (triton.cdiv(T, TOKENS), C // head_dim, B)


class ShortConvFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, weight, norm_channels, head_dim, eps):
        B, T, C = x.shape
        W = weight.shape[0]
        y = nan_buffer((B, T, C), x.dtype, x.device)
        _fwd_kernel[_grid(B, T, C, head_dim)](x, weight, y, T, C, norm_channels, W, eps, TOKENS,
                                              block_size(head_dim), head_dim)
        ctx.save_for_backward(x, weight)
        ctx.norm_channels, ctx.head_dim, ctx.eps = norm_channels, head_dim, eps
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        B, T, C = x.shape
        W = weight.shape[0]
        grid = _grid(B, T, C, ctx.head_dim)
        BD = block_size(ctx.head_dim)
        # float32: the gradient of the pre-activation is summed again below, W times
        dp = nan_buffer((B, T, C), torch.float32, x.device)
        _dpre_kernel[grid](x, weight, dy.contiguous(), dp, T, C, ctx.norm_channels, W, ctx.eps,
                           TOKENS, BD, ctx.head_dim)
        dx = nan_buffer((B, T, C), x.dtype, x.device)
        dw_part = nan_buffer((B * grid[0], W, C), torch.float32, x.device)
        _bwd_kernel[grid](x, weight, dp, dx, dw_part, T, C, W, TOKENS, BD, ctx.head_dim)
        return dx, dw_part.sum(0).to(weight.dtype), None, None, None


def short_conv_silu_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    norm_channels: int,
    head_dim: int,
    eps: float = 1e-12,
) -> torch.Tensor:
    """silu(causal depthwise conv of x), then each head of the first `norm_channels` channels
    divided by its L2 norm (at least eps, as `F.normalize`); differentiable in x and weight.

    Args:
        x: [B, T, C], float32, bfloat16 or float16; C a multiple of head_dim.
        weight: [W, C], tap j multiplying x[t - W + 1 + j]; cast to x's dtype.
        norm_channels: a multiple of head_dim, 0 <= norm_channels <= C.
    Returns:
        [B, T, C] in x's dtype (computed in float32).
    """
    if x.dim() != 3:
        raise ValueError(f"x must be [B, T, C], got shape {tuple(x.shape)}")
    B, T, C = x.shape
    if weight.dim() != 2 or weight.shape[1] != C:
        raise ValueError(f"weight must be [W, C] with C = {C}, got {tuple(weight.shape)}")
    if head_dim < 1 or C % head_dim or norm_channels % head_dim or not 0 <= norm_channels <= C:
        raise ValueError(f"C = {C} and norm_channels = {norm_channels} must be multiples of "
                         f"head_dim = {head_dim}, norm_channels <= C")
    return ShortConvFunction.apply(x.contiguous(), weight.to(x.dtype).contiguous(), norm_channels,
                                   head_dim, float(eps))
