"""Token-by-token reference of the (gated) delta rule. Slow on purpose: every faster
implementation (`chunk.py`, the Triton kernels in `ltm.kernels`) is tested against it."""
from __future__ import annotations

import torch


def naive_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule, one token at a time.

    Per token t, with state S of shape [K, V]:
        S = S * exp(g_t)                          (skipped when g is None)
        S = S + beta_t * k_t (v_t - S^T k_t)^T
        o_t = S^T (q_t * scale)

    Args:
        q, k: [B, T, H, K]; v: [B, T, H, V]; beta: [B, T, H]; g: [B, T, H] log decay (<= 0).
        scale: multiplies q, defaults to K ** -0.5.
        initial_state: [B, H, K, V] or None (zeros).
    Returns:
        o: [B, T, H, V] in the dtype of v; final state [B, H, K, V] in float32 (float64 for
        float64 inputs) when `output_final_state`, else None.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    dtype = torch.promote_types(q.dtype, torch.float32)
    out_dtype = v.dtype
    q, k, v, beta = (x.to(dtype) for x in (q, k, v, beta))
    state = q.new_zeros(B, H, K, V)
    if initial_state is not None:
        state = state + initial_state.to(dtype)
    outputs = []
    for t in range(T):
        if g is not None:
            state = state * g[:, t].to(dtype).exp()[..., None, None]
        # (B, H, V): what the state currently recalls for key k_t
        recalled = torch.einsum("bhk,bhkv->bhv", k[:, t], state)
        delta = beta[:, t, :, None] * (v[:, t] - recalled)
        state = state + k[:, t, :, :, None] * delta[:, :, None, :]
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, state))
    o = torch.stack(outputs, dim=1) if outputs else v.new_zeros(B, 0, H, V, dtype=dtype)
    return o.to(out_dtype), (state if output_final_state else None)
