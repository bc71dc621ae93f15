"""The Titans memory's in-chunk gate products, forward and backward, in Triton, beside the PyTorch
form they are tested against (`chunk_gates`, its gradients by autograd).

For alpha, eta [B, T, H] and chunks of BT tokens counted from the first (the last one padded with
tokens that forget nothing and keep all momentum), with f = 1 - alpha and e = eta, per chunk:
    a_t = prod_{r<=t} f_r,   E_t = prod_{r<=t} e_r,
    D_ts = prod_{s<r<=t} f_r,   P_ts = prod_{s<r<=t} e_r   (t >= s; 1 on the diagonal, 0 above),
    b = D E,   Gamma = D P,
and at the chunk's last token L: the ends (a_L, b_L, E_L), Gamma's row L (w_last) and P's (p_last).

The kernels use the recurrences these sums satisfy, row by row (rows t of Gamma and P; 0 before
the first, delta_t the unit row):
    b_t = f_t b_{t-1} + E_t,   P_t = e_t P_{t-1} + delta_t,   Gamma_t = f_t Gamma_{t-1} + P_t,
b as an associative scan, P and Gamma by a loop down the chunk that carries one [BT] row of each
(every thread its own columns: nothing waits on another thread). No tile product (a product of
two 64 x 64 tiles, float32-exact, spilled 1 to 6 KB a thread in these kernels on sm_90), and no
scan over [BT, BT] tiles (those made Gamma at about a sixth of the speed its bytes allow, H100,
2026-12-06). The backward runs the adjoint recurrences up the chunk (c-tilde_t = c-bar_t +
f_{t+1} c-tilde_{t+1}, the totals of each output's gradient) and collects, per factor, its
gradient times what it multiplied:
    df_t = a~_t a_{t-1} + b~_t b_{t-1} + rowsum(Gamma~_t * Gamma_{t-1}),
    de_t = E~_t E_{t-1} + rowsum(P~_t * P_{t-1}),
with P~ = P-bar + Gamma~ (carried with e) and E-bar + b~ scanned into E~; its loop up the chunk
reads Gamma's previous rows from the forward's Gamma and makes P's from them by the recurrence
above read backwards, P_t = Gamma_t - f_t Gamma_{t-1} (a difference, no division). No
division by a product anywhere: alpha = 1 or eta = 0 (a factor of exactly zero) stays exact.
One program per chunk, batch and head; every tile is a [BT] float32 vector. Made in PyTorch these were about 60 small launches per op
call and, at 8 x 2048 x 12 x 64 (chunk 16) on an H100, about 2 of the linear memory's 6.5 ms.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ltm.kernels.common import cdiv
from ltm.ops.titans.chunk import chunk_gate_products


def chunk_gates(alpha: torch.Tensor, eta: torch.Tensor, chunk: int) -> tuple[torch.Tensor, ...]:
    """The in-chunk gate products in PyTorch (the reference; differentiable), for alpha, eta
    [B, T, H], float32 (float64 for float64 inputs), chunks of `chunk` tokens from the first
    (the last one padded): a, b [B, H, NT * BT]; Gamma [B, H, NT * BT, BT]; the chunk ends (a, b,
    E at the chunk's last token) [B, H, NT, 3]; Gamma's and P's rows at that token
    [B, H, NT * BT]."""
    B, T, H = alpha.shape
    dtype = torch.promote_types(alpha.dtype, torch.float32)  # float64 stays (the tests' reference)
    a, b, gamma, ends, w_last, p_last = chunk_gate_products(
        alpha.to(dtype).transpose(1, 2), eta.to(dtype).transpose(1, 2), chunk)
    return (a.reshape(B, H, -1), b.reshape(B, H, -1), gamma.reshape(B, H, -1, chunk),
            ends.contiguous(), w_last.reshape(B, H, -1), p_last.reshape(B, H, -1))


@triton.jit
def _affine(a1, b1, a2, b2):
    """x -> a1 x + b1, then x -> a2 x + b2."""
    return a1 * a2, b1 * a2 + b2


@triton.jit
def _recur(coef, add, REVERSE: tl.constexpr):
    """y_t = coef_t y_{t-1} + add_t down axis 0 from y_{-1} = 0 (REVERSE: y_t = coef_t y_{t+1} +
    add_t up from the end)."""
    return tl.associative_scan((coef, add), 0, _affine, reverse=REVERSE)[1]


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
    b = _recur(f, E, False)
    L = tl.minimum(T - 1 - c * BT, BT - 1)  # the chunk's last token
    base = (i_bh * NT + c) * BT
    # P's and Gamma's rows token by token, each a [BT] vector over the columns s: the recurrence
    # runs along the loop, so no thread waits on another (a scan over [BT, BT] tiles did, and took
    # about 6x the time its 16 KB of output needs to be written)
    P_row = tl.zeros([BT], dtype=tl.float32)
    gamma_row = tl.zeros([BT], dtype=tl.float32)
    for i in range(BT):
        f_i, e_i = _gate_factors(alpha, eta, i_b, i_h, c * BT + i, c * BT + i < T, T, H)
        P_row = e_i * P_row + tl.where(r == i, 1.0, 0.0)
        gamma_row = f_i * gamma_row + P_row
        tl.store(gamma_out + (base + i) * BT + r, gamma_row)
        at_last = r * 0 + i == L
        tl.store(w_last_out + base + r, gamma_row, mask=at_last)
        tl.store(p_last_out + base + r, P_row, mask=at_last)
    last = r == L
    tl.store(a_out + base + r, a)
    tl.store(b_out + base + r, b)
    ends = (i_bh * NT + c) * 3
    tl.store(ends_out + ends, tl.sum(tl.where(last, a, 0.0), 0))
    tl.store(ends_out + ends + 1, tl.sum(tl.where(last, b, 0.0), 0))
    tl.store(ends_out + ends + 2, tl.sum(tl.where(last, E, 0.0), 0))


@triton.jit
def _gates_bwd_kernel(alpha, eta, gamma, da, db, dgamma, dends, dw_last, dp_last, dalpha, deta, T,
                      NT, H: tl.constexpr, BT: tl.constexpr):
    c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    r = tl.arange(0, BT)
    t = c * BT + r
    mt = t < T
    # the previous token's factors (a row before the chunk: its values never reach a result) and
    # the next one's (1 past the chunk: they multiply the zero after the last row)
    f_prev, e_prev = _gate_factors(alpha, eta, i_b, i_h, t - 1, (r >= 1) & (t - 1 < T), T, H)
    f_next, e_next = _gate_factors(alpha, eta, i_b, i_h, t + 1, (r + 1 < BT) & (t + 1 < T), T, H)
    # a_{t-1}, E_{t-1} (1 at the first token), b_{t-1} (0 there)
    a_prev = tl.cumprod(tl.where(r >= 1, f_prev, 1.0), 0)
    E_prev = tl.cumprod(tl.where(r >= 1, e_prev, 1.0), 0)
    b_prev = _recur(f_prev, tl.where(r >= 1, E_prev, 0.0), False)
    L = tl.minimum(T - 1 - c * BT, BT - 1)
    last = r == L
    base = (i_bh * NT + c) * BT
    ends = (i_bh * NT + c) * 3
    # the outputs' gradients, the chunk ends' added at the last token, and their totals up the chunk
    a_total = _recur(f_next, tl.load(da + base + r) + tl.where(last, tl.load(dends + ends), 0.0), True)
    b_total = _recur(f_next, tl.load(db + base + r) + tl.where(last, tl.load(dends + ends + 1), 0.0),
                     True)
    e_total = _recur(e_next, tl.where(last, tl.load(dends + ends + 2), 0.0) + b_total, True)
    # up the chunk: Gamma's and P's gradient totals row by row, each met with the row before it
    dw = tl.load(dw_last + base + r)
    dp = tl.load(dp_last + base + r)
    gamma_total = tl.zeros([BT], dtype=tl.float32)
    p_total = tl.zeros([BT], dtype=tl.float32)
    df_rows = tl.zeros([BT], dtype=tl.float32)
    de_rows = tl.zeros([BT], dtype=tl.float32)
    for j in range(BT):
        i = BT - 1 - j
        nxt = c * BT + i + 1  # masks built from tensors: the interpreter takes no Python bool
        f_n, e_n = _gate_factors(alpha, eta, i_b, i_h, nxt, (nxt < c * BT + BT) & (nxt < T), T, H)
        gamma_total = (tl.load(dgamma + (base + i) * BT + r) + tl.where(i == L, dw, 0.0)
                       + f_n * gamma_total)
        p_total = tl.where(i == L, dp, 0.0) + gamma_total + e_n * p_total
        # Gamma's rows i - 1 and i - 2 (0 before the chunk) as the forward stored them; P's row
        # i - 1 from them
        before, two_before = r * 0 + i >= 1, r * 0 + i >= 2
        gamma_before = tl.load(gamma + (base + i - 1) * BT + r, mask=before, other=0.0)
        gamma_two_before = tl.load(gamma + (base + i - 2) * BT + r, mask=two_before, other=0.0)
        prv = c * BT + i - 1
        f_p, _ = _gate_factors(alpha, eta, i_b, i_h, prv, (prv >= c * BT) & (prv < T), T, H)
        P_before = gamma_before - f_p * gamma_two_before
        df_rows = tl.where(r == i, tl.sum(gamma_total * gamma_before, 0), df_rows)
        de_rows = tl.where(r == i, tl.sum(p_total * P_before, 0), de_rows)
    df = a_total * a_prev + b_total * b_prev + df_rows
    de = e_total * E_prev + de_rows
    offs = (i_b * T + t) * H + i_h
    tl.store(dalpha + offs, (-df).to(dalpha.dtype.element_ty), mask=mt)
    tl.store(deta + offs, de.to(deta.dtype.element_ty), mask=mt)


def _warps(chunk: int) -> int:
    # every tile is one [BT] row: one warp holds it (BT / 32 numbers a thread), and the loops'
    # row sums stay within the warp. 2 and 4 warps were slower (H100, 8 x 2048 x 12, chunk 32:
    # forward+backward 84.7 us on 1 warp, 97.3 on 2, 164.4 on 4; records/gpu/titans/
    # titans-gates-rows-h100-2026-12-06.json)
    return 1


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
                           grads: tuple[torch.Tensor, ...], gamma: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of alpha and eta (their dtype and shape) from those of `chunk_gates`' six
    outputs (float32, contiguous, its layouts), given the forward's Gamma
    (`triton_chunk_gates`' third output)."""
    B, T, H = alpha.shape
    NT = cdiv(T, chunk)
    dalpha, deta = torch.empty_like(alpha), torch.empty_like(eta)
    _gates_bwd_kernel[(NT, B * H)](alpha, eta, gamma, *grads, dalpha, deta, T, NT, H=H, BT=chunk,
                                   num_warps=_warps(chunk))
    return dalpha, deta
