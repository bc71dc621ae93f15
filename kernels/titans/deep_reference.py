"""The deep Titans memory (two layers, SiLU between) for one chunk in plain PyTorch, forward and a
hand-written backward: the formulas the Triton kernels (`deep_fwd.py`, `deep_bwd.py`) transcribe,
kept readable here and tested against autograd (tests/kernels/test_kernels_titans_deep.py).

One chunk of n tokens entering with W1 [K, E], S1, W2 [E, V], S2 (leading batch dims allowed),
the gate products as `chunk.py`'s `chunk_gates` makes them (a, b [n], Gamma [n, n], ends = (a, b,
E) at the chunk's last token, wl and pl = Gamma's and P's rows there), and Gg = Gamma * g:

    z1 = k W1, h1 = silu(z1), z2 = h1 W2, d2 = z2 - v, u = d2 W2^T, d1 = u * silu'(z1)
    N  = |k|^2 |d1|^2 + |h1|^2 |d2|^2,  clip = C / sqrt(max(N, C^2)),  g = theta * clip
    y1 = a (q W1) + b (q S1) - (Gg o q k^T) d1,   r1 = silu(y1)
    o  = a (r1 W2) + b (r1 S2) - (Gg o r1 h1^T) d2
    W' = a_end W + b_end S - x^T ((wl g) d),  S' = e_end S - x^T ((pl g) d)   per layer, x1 = k,
                                                                              x2 = h1
The chunk starts at a chunk boundary, so the gradients are taken at the entering weights.
"""
from __future__ import annotations

import torch

from ltm.ops.titans.memory import silu_grad


def silu_grad2(z: torch.Tensor) -> torch.Tensor:
    """d^2 silu(z) / dz^2 = s (1 - s) (2 + z (1 - 2 s)), s = sigmoid(z)."""
    s = torch.sigmoid(z)
    return s * (1 - s) * (2 + z * (1 - 2 * s))


def _t(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(-1, -2)


def _row(x: torch.Tensor) -> torch.Tensor:
    return x[..., :, None]


def deep_chunk_forward(q, k, v, theta, gates, state, clip: float | None):
    """The reads o [..., n, V] and the state after the chunk (W1', S1', W2', S2')."""
    a, b, gamma, ends, wl, pl = gates
    W1, S1, W2, S2 = state
    z1 = k @ W1
    h1 = torch.nn.functional.silu(z1)
    d2 = h1 @ W2 - v
    d1 = (d2 @ _t(W2)) * silu_grad(z1)
    if clip is None:
        g = theta
    else:
        norm = k.square().sum(-1) * d1.square().sum(-1) + h1.square().sum(-1) * d2.square().sum(-1)
        g = theta * clip * torch.rsqrt(norm.clamp_min(clip ** 2))
    gg = gamma * g[..., None, :]
    r1 = torch.nn.functional.silu(_row(a) * (q @ W1) + _row(b) * (q @ S1) - (gg * (q @ _t(k))) @ d1)
    o = _row(a) * (r1 @ W2) + _row(b) * (r1 @ S2) - (gg * (r1 @ _t(h1))) @ d2
    a_end, b_end, e_end = (ends[..., i, None, None] for i in range(3))
    new = []
    for W, S, x, d in ((W1, S1, k, d1), (W2, S2, h1, d2)):
        new += [a_end * W + b_end * S - _t(x) @ (_row(wl * g) * d),
                 e_end * S - _t(x) @ (_row(pl * g) * d)]
    return o, tuple(new)


def _reads_backward(q, k, a, b, gamma, g, state, z1, d1, d2, do):
    """The reads' part of the backward: gradients of q, k (the layer-1 read), a, b, Gamma, g,
    h1 and the deltas as the reads see them, and the entering state."""
    W1, S1, W2, S2 = state
    h1 = torch.nn.functional.silu(z1)
    gg = gamma * g[..., None, :]
    qk = q @ _t(k)
    y1 = _row(a) * (q @ W1) + _row(b) * (q @ S1) - (gg * qk) @ d1
    r1 = torch.nn.functional.silu(y1)
    rh = r1 @ _t(h1)
    dA2 = -(do @ _t(d2))  # the gradient of the score matrix (Gg o r1 h1^T)
    m2 = dA2 * gg
    dr1 = _row(a) * (do @ _t(W2)) + _row(b) * (do @ _t(S2)) + m2 @ h1
    dy1 = dr1 * silu_grad(y1)
    dA1 = -(dy1 @ _t(d1))
    m1 = dA1 * gg
    return dict(
        q=_row(a) * (dy1 @ _t(W1)) + _row(b) * (dy1 @ _t(S1)) + m1 @ k, k=_t(m1) @ q,
        a=(do * (r1 @ W2)).sum(-1) + (dy1 * (q @ W1)).sum(-1),
        b=(do * (r1 @ S2)).sum(-1) + (dy1 * (q @ S1)).sum(-1),
        gamma=(dA2 * rh + dA1 * qk) * g[..., None, :],
        g=(dA2 * gamma * rh).sum(-2) + (dA1 * gamma * qk).sum(-2),
        h1=_t(m2) @ r1, d1=-_t(gg * qk) @ dy1, d2=-_t(gg * rh) @ do,
        state=[_t(q) @ (_row(a) * dy1), _t(q) @ (_row(b) * dy1),
               _t(r1) @ (_row(a) * do), _t(r1) @ (_row(b) * do)])


def deep_chunk_backward(q, k, v, theta, gates, state, clip: float | None, do, dnew):
    """The gradients of q, k, v, theta, the gates (a, b, Gamma, ends, wl, pl) and the entering
    state (dW1, dS1, dW2, dS2), given do and the gradients `dnew` of the state after the chunk."""
    a, b, gamma, ends, wl, pl = gates
    W1, S1, W2, S2 = state
    dW1n, dS1n, dW2n, dS2n = dnew
    z1 = k @ W1
    h1, sp = torch.nn.functional.silu(z1), silu_grad(z1)
    d2 = h1 @ W2 - v
    u = d2 @ _t(W2)
    d1 = u * sp
    k_sq, h_sq = k.square().sum(-1), h1.square().sum(-1)
    norm = k_sq * d1.square().sum(-1) + h_sq * d2.square().sum(-1)
    clip_f = torch.ones_like(theta) if clip is None else clip * torch.rsqrt(norm.clamp_min(clip ** 2))
    g = theta * clip_f
    r = _reads_backward(q, k, a, b, gamma, g, state, z1, d1, d2, do)
    dk, dd1, dd2, dh1 = r["k"], r["d1"], r["d2"], r["h1"]
    # the hand-off W' = a_end W + b_end S - x^T ((wl g) d), S' = e_end S - x^T ((pl g) d)
    kdw, kds, hdw, hds = k @ dW1n, k @ dS1n, h1 @ dW2n, h1 @ dS2n
    w_sum = -((kdw * d1).sum(-1) + (hdw * d2).sum(-1))  # the gradient of wl * g
    s_sum = -((kds * d1).sum(-1) + (hds * d2).sum(-1))
    dg = r["g"] + wl * w_sum + pl * s_sum
    wg, pg = _row(wl * g), _row(pl * g)
    dd1 = dd1 - wg * kdw - pg * kds
    dd2 = dd2 - wg * hdw - pg * hds
    dk = dk - (wg * d1) @ _t(dW1n) - (pg * d1) @ _t(dS1n)
    dh1 = dh1 - (wg * d2) @ _t(dW2n) - (pg * d2) @ _t(dS2n)
    # the clip: dN = -dg theta clip / (2 N) where it acts
    if clip is not None:
        dn = torch.where(norm > clip ** 2, -dg * theta * clip_f / (2 * norm.clamp_min(clip ** 2)), 0)
        dk = dk + _row(2 * dn * d1.square().sum(-1)) * k
        dd1 = dd1 + _row(2 * dn * k_sq) * d1
        dh1 = dh1 + _row(2 * dn * d2.square().sum(-1)) * h1
        dd2 = dd2 + _row(2 * dn * h_sq) * d2
    # the deltas: d1 = (d2 W2^T) silu'(z1), d2 = silu(z1) W2 - v, z1 = k W1
    du = dd1 * sp
    dz2 = dd2 + du @ W2
    dh1 = dh1 + dz2 @ _t(W2)
    dz1 = dd1 * u * silu_grad2(z1) + dh1 * sp
    dk = dk + dz1 @ _t(W1)
    a_end, b_end, e_end = (ends[..., i, None, None] for i in range(3))
    dW1, dS1, dW2, dS2 = r["state"]
    dstate = (a_end * dW1n + dW1 + _t(k) @ dz1, e_end * dS1n + b_end * dW1n + dS1,
              a_end * dW2n + dW2 + _t(du) @ d2 + _t(h1) @ dz2, e_end * dS2n + b_end * dW2n + dS2)
    dends = torch.stack([(W1 * dW1n).sum((-1, -2)) + (W2 * dW2n).sum((-1, -2)),
                         (S1 * dW1n).sum((-1, -2)) + (S2 * dW2n).sum((-1, -2)),
                         (S1 * dS1n).sum((-1, -2)) + (S2 * dS2n).sum((-1, -2))], -1)
    dgates = (r["a"], r["b"], r["gamma"], dends, w_sum * g, s_sum * g)
    return r["q"], dk, -dz2, dg * clip_f, dgates, dstate
