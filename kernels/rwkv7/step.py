"""One-token step kernel of the RWKV-7 recurrence, for decoding from a state.

Each program owns one (batch, head, value block) of the [B, H, K, V] float32 state, reads it once,
applies one token and writes the new state and the output. Forward only (decoding needs no
gradients). Tested against `ltm.ops.rwkv7.step.rwkv7_step` and, over many steps,
`ltm.ops.rwkv7.naive.naive_rwkv7`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ltm.kernels.common import block_size, cdiv, check_bhd, check_head_dim, check_state, nan_buffer


@triton.jit
def _rwkv7_step_kernel(r, w, k, v, a, b, s, o, s_new, K: tl.constexpr, V: tl.constexpr,
                       BK: tl.constexpr, BV: tl.constexpr, USE_S: tl.constexpr):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    p_state = i_bh * K * V + o_k[:, None] * V + o_v[None, :]
    b_s = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_S:
        b_s += tl.load(s + p_state, mask=m_kv, other=0.).to(tl.float32)
    b_r = tl.load(r + i_bh * K + o_k, mask=m_k, other=0.).to(tl.float32)
    b_w = tl.load(w + i_bh * K + o_k, mask=m_k, other=0.).to(tl.float32)
    b_k = tl.load(k + i_bh * K + o_k, mask=m_k, other=0.).to(tl.float32)
    b_a = tl.load(a + i_bh * K + o_k, mask=m_k, other=0.).to(tl.float32)
    b_b = tl.load(b + i_bh * K + o_k, mask=m_k, other=0.).to(tl.float32)
    b_v = tl.load(v + i_bh * V + o_v, mask=m_v, other=0.).to(tl.float32)
    # (BV,): a^T S, before the decay
    sa = tl.sum(b_a[:, None] * b_s, axis=0)
    b_s = b_s * tl.exp(b_w)[:, None] + b_b[:, None] * sa[None, :] + b_k[:, None] * b_v[None, :]
    b_o = tl.sum(b_r[:, None] * b_s, axis=0)
    tl.store(o + i_bh * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
    tl.store(s_new + p_state, b_s, mask=m_kv)



def triton_rwkv7_step(
    r: torch.Tensor,
    w: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advance the RWKV-7 recurrence by one token, in Triton (no autograd).

        S = S * exp(w)[:, None] + b (a^T S) + k v^T;  o = S^T r      (a^T S read before the decay)

    Same function as `ltm.ops.rwkv7.step.rwkv7_step`.
    Args:
        r, w, k, a, b: [B, H, K]; v: [B, H, V] (float32, bfloat16 or float16; K, V <= 128).
        state: [B, H, K, V] or None for zeros (read in float32; not modified).
    Returns:
        o: [B, H, V] in the dtype of v; the new state [B, H, K, V] in float32.
    """
    if r.dim() != 3:
        raise ValueError(f"r must be [B, H, K], got shape {tuple(r.shape)}")
    B, H, K = r.shape
    for name, x in (("r", r), ("w", w), ("k", k), ("a", a), ("b", b)):
        check_bhd(name, x, B, H)
        if x.shape != r.shape:
            raise ValueError(f"{name} must be [B, H, K] = {(B, H, K)} like r, got {tuple(x.shape)}")
    check_bhd("v", v, B, H)
    V = v.shape[-1]
    check_head_dim("r/k", K)
    check_head_dim("v", V)
    check_state("state", state, (B, H, K, V))
    BK, BV = block_size(K), min(block_size(V), 64)
    s = None if state is None else state.float().contiguous()
    o = nan_buffer((B, H, V), v.dtype, r.device)
    s_new = nan_buffer((B, H, K, V), torch.float32, r.device)
    _rwkv7_step_kernel[(cdiv(V, BV), B * H)](
        *(x.contiguous() for x in (r, w, k, v, a, b)), s, o, s_new, K, V, BK, BV, s is not None,
        num_warps=4)
    return o, s_new
