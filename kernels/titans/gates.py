"""The Titans memory's in-chunk gate products, forward and backward, in Triton, beside the PyTorch
form they are tested against (`chunk_gates`, its gradients by autograd).

For alpha, eta [B, T, H] and chunks of BT tokens counted from the first (the last one padded with
tokens that forget nothing and keep all momentum), with f = 1 - alpha and e = eta, per chunk:
    a_t = prod_{r<=t} f_r,   E_t = prod_{r<=t} e_r,
    D_ts = prod_{s<r<=t} f_r,   P_ts = prod_{s<r<=t} e_r   (t >= s; 1 on the diagonal, 0 above),
    b = D E,   Gamma = D P,
and at the chunk's last token L: the ends (a_L, b_L, E_L), Gamma's row L (w_last) and P's (p_last).

The backward takes the gradients of those six outputs to f and e with no division by a product
(alpha = 1 or eta = 0, a factor of exactly zero, stays exact): a product's derivative in one of
its factors is the product of the factors before it and after it,
    d a_t / d f_r = a_{r-1} D_tr,          d D_ts / d f_r = D_tr D_{r-1,s}   (s < r <= t),
so, with the shifted transfer matrix D'_rs = D_{r-1,s} (s < r; 0 elsewhere) and the total
gradients A-bar, D-bar of a and D,
    df = a' * (D^T A-bar) + colsum(D * (D-bar D'^T)),   a'_r = a_{r-1},
and the same for e with E, P. D-bar = B-bar E^T + Gamma-bar P^T, P-bar = D^T Gamma-bar (+ p_last's
row), E-bar = D^T B-bar (+ the end's). One program per chunk, batch and head; every tile is [BT]
or [BT, BT] float32, multiplied in "tf32x3" (float32-level error on the tensor cores: "ieee"
products of 64 x 64 tiles made the backward 10.5 ms at 8 x 2048 x 12, chunk 64, on an H100).
Made in PyTorch these were about 60 small launches per op call and, at 8 x 2048 x 12 x 64 (chunk
16) on an H100, about 2 of the linear memory's 6.5 ms (with these kernels: 2.6 ms).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ltm.kernels.common import cdiv
from ltm.ops.titans.chunk import transfer


def chunk_gates(alpha: torch.Tensor, eta: torch.Tensor, chunk: int) -> tuple[torch.Tensor, ...]:
    """The in-chunk gate products in PyTorch (the reference; differentiable), for alpha, eta
    [B, T, H], float32 (float64 for float64 inputs), chunks of `chunk` tokens from the first
    (the last one padded): a, b [B, H, NT * BT]; Gamma [B, H, NT * BT, BT]; the chunk ends (a, b,
    E at the chunk's last token) [B, H, NT, 3]; Gamma's and P's rows at that token
    [B, H, NT * BT]."""
    B, T, H = alpha.shape
    NT = cdiv(T, chunk)
    dtype = torch.promote_types(alpha.dtype, torch.float32)  # float64 stays (the tests' reference)
    # pads forget nothing and keep all momentum; their rows are never read
    f = F.pad((1 - alpha.to(dtype)).transpose(1, 2), (0, NT * chunk - T), value=1.0)
    e = F.pad(eta.to(dtype).transpose(1, 2), (0, NT * chunk - T), value=1.0)
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


@triton.jit
def _transfer(x, rows, SHIFT: tl.constexpr):
    """[BT, BT]: prod_{s<r<=t} x_r at (t, s), t >= s (0 above); with SHIFT, x holds each row's
    previous factor (x_{r-1} at r) and the result is row t - 1's, strictly below the diagonal."""
    factors = tl.where(rows[:, None] - SHIFT > rows[None, :], x[:, None], 1.0)
    keep = rows[:, None] - SHIFT >= rows[None, :]
    return tl.where(keep, tl.cumprod(factors, 0), 0.0)


@triton.jit
def _gate_factors(alpha, eta, i_b, i_h, t, mt, T, H: tl.constexpr):
    """f = 1 - alpha and e = eta at tokens t, [BT] float32; 1 (a pad) where not mt."""
    offs = (i_b * T + t) * H + i_h
    f = 1.0 - tl.load(alpha + offs, mask=mt, other=0.0).to(tl.float32)
    e = tl.load(eta + offs, mask=mt, other=1.0).to(tl.float32)
    return f, e


@triton.jit
def _gates_fwd_kernel(alpha, eta, a_out, b_out, gamma_out, ends_out, w_last_out, p_last_out, T,
                      NT, H: tl.constexpr, BT: tl.constexpr):
    c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    r = tl.arange(0, BT)
    t = c * BT + r
    f, e = _gate_factors(alpha, eta, i_b, i_h, t, t < T, T, H)
    a, E = tl.cumprod(f, 0), tl.cumprod(e, 0)
    D, P = _transfer(f, r, 0), _transfer(e, r, 0)
    b = tl.sum(D * E[None, :], 1)
    gamma = tl.dot(D, P, input_precision="tf32x3")
    last = r == tl.minimum(T - 1 - c * BT, BT - 1)
    base = (i_bh * NT + c) * BT
    tl.store(a_out + base + r, a)
    tl.store(b_out + base + r, b)
    tl.store(gamma_out + (base + r)[:, None] * BT + r[None, :], gamma)
    tl.store(w_last_out + base + r, tl.sum(tl.where(last[:, None], gamma, 0.0), 0))
    tl.store(p_last_out + base + r, tl.sum(tl.where(last[:, None], P, 0.0), 0))
    ends = (i_bh * NT + c) * 3
    tl.store(ends_out + ends, tl.sum(tl.where(last, a, 0.0), 0))
    tl.store(ends_out + ends + 1, tl.sum(tl.where(last, b, 0.0), 0))
    tl.store(ends_out + ends + 2, tl.sum(tl.where(last, E, 0.0), 0))


@triton.jit
def _gates_bwd_kernel(alpha, eta, da, db, dgamma, dends, dw_last, dp_last, dalpha, deta, T, NT,
                      H: tl.constexpr, BT: tl.constexpr):
    c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    r = tl.arange(0, BT)
    t = c * BT + r
    mt = t < T
    f, e = _gate_factors(alpha, eta, i_b, i_h, t, mt, T, H)
    # each token's previous factors (1 before the chunk's first token)
    f_prev, e_prev = _gate_factors(alpha, eta, i_b, i_h, t - 1, (r >= 1) & (t - 1 < T), T, H)
    f_prev, e_prev = tl.where(r >= 1, f_prev, 1.0), tl.where(r >= 1, e_prev, 1.0)
    E = tl.cumprod(e, 0)
    D, P = _transfer(f, r, 0), _transfer(e, r, 0)
    last = r == tl.minimum(T - 1 - c * BT, BT - 1)
    base = (i_bh * NT + c) * BT
    ends = (i_bh * NT + c) * 3
    a_bar = tl.load(da + base + r) + tl.where(last, tl.load(dends + ends), 0.0)
    b_bar = tl.load(db + base + r) + tl.where(last, tl.load(dends + ends + 1), 0.0)
    gamma_bar = (tl.load(dgamma + (base + r)[:, None] * BT + r[None, :])
                 + tl.where(last[:, None], tl.load(dw_last + base + r)[None, :], 0.0))
    lower = r[:, None] >= r[None, :]
    d_bar = tl.where(lower, b_bar[:, None] * E[None, :]
                     + tl.dot(gamma_bar, tl.trans(P), input_precision="tf32x3"), 0.0)
    p_bar = tl.where(lower, tl.dot(tl.trans(D), gamma_bar, input_precision="tf32x3")
                     + tl.where(last[:, None], tl.load(dp_last + base + r)[None, :], 0.0), 0.0)
    e_bar = tl.sum(D * b_bar[:, None], 0) + tl.where(last, tl.load(dends + ends + 2), 0.0)
    d_shift = tl.dot(d_bar, tl.trans(_transfer(f_prev, r, 1)), input_precision="tf32x3")
    p_shift = tl.dot(p_bar, tl.trans(_transfer(e_prev, r, 1)), input_precision="tf32x3")
    df = tl.cumprod(f_prev, 0) * tl.sum(D * a_bar[:, None], 0) + tl.sum(D * d_shift, 0)
    de = tl.cumprod(e_prev, 0) * tl.sum(P * e_bar[:, None], 0) + tl.sum(P * p_shift, 0)
    offs = (i_b * T + t) * H + i_h
    tl.store(dalpha + offs, (-df).to(dalpha.dtype.element_ty), mask=mt)
    tl.store(deta + offs, de.to(deta.dtype.element_ty), mask=mt)


def _warps(chunk: int) -> int:
    # the backward holds about ten [BT, BT] float32 tiles: 40 registers a thread each at BT 64
    # with 4 warps
    return 4 if chunk <= 16 else 8


def triton_chunk_gates(alpha: torch.Tensor, eta: torch.Tensor, chunk: int
                       ) -> tuple[torch.Tensor, ...]:
    """`chunk_gates`' six outputs (float32, its layouts) from one launch; alpha, eta [B, T, H]
    contiguous, chunk one of the kernels' chunk sizes (>= 16, a power of two)."""
    B, T, H = alpha.shape
    NT = cdiv(T, chunk)
    f32 = dict(dtype=torch.float32, device=alpha.device)
    a, b, w_last, p_last = (torch.empty((B, H, NT * chunk), **f32) for _ in range(4))
    gamma = torch.empty((B, H, NT * chunk, chunk), **f32)
    ends = torch.empty((B, H, NT, 3), **f32)
    _gates_fwd_kernel[(NT, B * H)](alpha, eta, a, b, gamma, ends, w_last, p_last, T, NT, H=H,
                                   BT=chunk, num_warps=_warps(chunk))
    return a, b, gamma, ends, w_last, p_last


def triton_chunk_gates_bwd(alpha: torch.Tensor, eta: torch.Tensor, chunk: int,
                           grads: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of alpha and eta (their dtype and shape) from those of `chunk_gates`' six
    outputs (float32, contiguous, its layouts)."""
    B, T, H = alpha.shape
    NT = cdiv(T, chunk)
    dalpha, deta = torch.empty_like(alpha), torch.empty_like(eta)
    _gates_bwd_kernel[(NT, B * H)](alpha, eta, *grads, dalpha, deta, T, NT, H=H, BT=chunk,
                                   num_warps=_warps(chunk))
    return dalpha, deta
