"""Token-by-token reference of the RWKV-7 recurrence (the generalized delta rule). Slow on
purpose: every faster implementation is tested against it."""
from __future__ import annotations

import torch


def naive_rwkv7(
    r: torch.Tensor,
    w: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RWKV-7 time mixing, one token at a time.

    Per token t, with state S of shape [K, V] and `a_t^T S` read before the decay:
        S = S * exp(w_t)[:, None] + b_t (a_t^T S) + k_t v_t^T
        o_t = S^T r_t                      (no extra scale)
    In RWKV-7, a = -kk and b = kk * a_lr (kk the normalised key), which makes the update a
    decayed delta rule with an in-context learning rate.

    Args:
        r, w, k, a, b: [B, T, H, K] (w is the log decay, <= 0); v: [B, T, H, V].
        initial_state: [B, H, K, V] or None (zeros).
    Returns:
        o: [B, T, H, V] in the dtype of v; final state [B, H, K, V] in float32 (float64 for
        float64 inputs) when `output_final_state`, else None.
    """
    B, T, H, K = r.shape
    V = v.shape[-1]
    dtype = torch.promote_types(r.dtype, torch.float32)
    out_dtype = v.dtype
    r, w, k, v, a, b = (x.to(dtype) for x in (r, w, k, v, a, b))
    state = r.new_zeros(B, H, K, V)
    if initial_state is not None:
        state = state + initial_state.to(dtype)
    outputs = []
    for t in range(T):
        # (B, H, V): a_t^T S, taken before the decay
        sa = torch.einsum("bhk,bhkv->bhv", a[:, t], state)
        state = (state * w[:, t].exp()[..., None]
                 + b[:, t, :, :, None] * sa[:, :, None, :]
                 + k[:, t, :, :, None] * v[:, t, :, None, :])
        outputs.append(torch.einsum("bhk,bhkv->bhv", r[:, t], state))
    o = torch.stack(outputs, dim=1) if outputs else v.new_zeros(B, 0, H, V, dtype=dtype)
    return o.to(out_dtype), (state if output_final_state else None)
