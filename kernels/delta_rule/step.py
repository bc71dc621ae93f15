"""One-token step kernel of the (gated) delta rule, for decoding from a state.

Each program owns one (batch, head, value block) of the [B, H, K, V] float32 state, reads it once,
applies one token and writes the new state and the output. Forward only (decoding needs no
gradients). Tested against `ltm.ops.delta_rule.step.delta_rule_step` and, over many steps,
`ltm.ops.delta_rule.naive.naive_delta_rule`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ltm.kernels.common import block_size, cdiv, check_bhd, check_head_dim, check_state, nan_buffer


@triton.jit
def _delta_rule_step_kernel(q, k, v, beta, g, s, o, s_new, scale, K: tl.constexpr,
                            V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                            USE_G: tl.constexpr, USE_S: tl.constexpr):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    p_state = i_bh * K * V + o_k[:, None] * V + o_v[None, :]
    b_s = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_S:
        b_s += tl.load(s + p_state, mask=m_kv, other=0.).to(tl.float32)
    b_q = tl.load(q + i_bh * K + o_k, mask=m_k, other=0.).to(tl.float32) * scale
    b_k = tl.load(k + i_bh * K + o_k, mask=m_k, other=0.).to(tl.float32)
    b_v = tl.load(v + i_bh * V + o_v, mask=m_v, other=0.).to(tl.float32)
    b_beta = tl.load(beta + i_bh).to(tl.float32)
    if USE_G:
        b_s = b_s * tl.exp(tl.load(g + i_bh).to(tl.float32))
    # (BV,): what the state recalls for key k
    recalled = tl.sum(b_k[:, None] * b_s, axis=0)
    b_s += b_k[:, None] * (b_beta * (b_v - recalled))[None, :]
    b_o = tl.sum(b_q[:, None] * b_s, axis=0)
    tl.store(o + i_bh * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
    tl.store(s_new + p_state, b_s, mask=m_kv)



def triton_delta_rule_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    scale: float | None = None,
    state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advance the gated delta rule by one token, in Triton (no autograd).

        S = S * exp(g);  S = S + beta k (v - S^T k)^T;  o = S^T (scale q)

    Same function as `ltm.ops.delta_rule.step.delta_rule_step`.
    Args:
        q, k: [B, H, K]; v: [B, H, V] (float32, bfloat16 or float16; K, V <= 128);
        beta: [B, H]; g: [B, H] log decay (<= 0) or None. scale defaults to K ** -0.5.
        state: [B, H, K, V] or None for zeros (read in float32; not modified).
    Returns:
        o: [B, H, V] in the dtype of v; the new state [B, H, K, V] in float32.
    """
    if q.dim() != 3:
        raise ValueError(f"q must be [B, H, K], got shape {tuple(q.shape)}")
    B, H, K = q.shape
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_bhd(name, x, B, H)
    if k.shape != q.shape:
        raise ValueError(f"k must be [B, H, K] = {(B, H, K)} like q, got {tuple(k.shape)}")
    if tuple(beta.shape) != (B, H):
        raise ValueError(f"beta must be [B, H] = {(B, H)}, got {tuple(beta.shape)}")
    if g is not None and tuple(g.shape) != (B, H):
        raise ValueError(f"g must be [B, H] = {(B, H)} or None, got {tuple(g.shape)}")
    V = v.shape[-1]
    check_head_dim("q/k", K)
    check_head_dim("v", V)
    check_state("state", state, (B, H, K, V))
    scale = K ** -0.5 if scale is None else float(scale)
    BK, BV = block_size(K), min(block_size(V), 64)
    s = None if state is None else state.float().contiguous()
    o = nan_buffer((B, H, V), v.dtype, q.device)
    s_new = nan_buffer((B, H, K, V), torch.float32, q.device)
    _delta_rule_step_kernel[(cdiv(V, BV), B * H)](
        q.contiguous(), k.contiguous(), v.contiguous(), beta.contiguous(),
        None if g is None else g.contiguous(), s, o, s_new, scale, K, V, BK, BV,
        g is not None, s is not None, num_warps=4)
    return o, s_new

