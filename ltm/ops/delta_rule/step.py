"""One-token form of the (gated) delta rule, for decoding: the state after T calls equals the
final state of `naive_delta_rule` over the same T tokens."""
from __future__ import annotations

import torch


def _check_step_shapes(q, k, v, beta, g, state) -> None:
    if q.dim() != 3:
        raise ValueError(f"q must be [B, H, K], got shape {tuple(q.shape)}")
    B, H, K = q.shape
    if k.shape != q.shape:
        raise ValueError(f"k must be [B, H, K] = {(B, H, K)} like q, got {tuple(k.shape)}")
    if v.dim() != 3 or v.shape[:2] != (B, H):
        raise ValueError(f"v must be [B, H, V] with B, H = {(B, H)}, got {tuple(v.shape)}")
    if beta.shape != (B, H):
        raise ValueError(f"beta must be [B, H] = {(B, H)}, got {tuple(beta.shape)}")
    if g is not None and g.shape != (B, H):
        raise ValueError(f"g must be [B, H] = {(B, H)} or None, got {tuple(g.shape)}")
    if state is not None and state.shape != (B, H, K, v.shape[-1]):
        raise ValueError(f"state must be [B, H, K, V] = {(B, H, K, v.shape[-1])} or None, "
                         f"got {tuple(state.shape)}")


def delta_rule_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    scale: float | None = None,
    state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advance the gated delta rule by one token.

        S = S * exp(g);  S = S + beta k (v - S^T k)^T;  o = S^T (scale q)

    Args:
        q, k: [B, H, K]; v: [B, H, V]; beta: [B, H]; g: [B, H] log decay (<= 0) or None.
        scale: multiplies q, defaults to K ** -0.5.
        state: [B, H, K, V] (float32, or float64) or None for zeros.
    Returns:
        o: [B, H, V] in the dtype of v; new state [B, H, K, V] in float32 (float64 for float64
        inputs).
    """
    _check_step_shapes(q, k, v, beta, g, state)
    B, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    out_dtype = v.dtype
    dtype = torch.promote_types(q.dtype, torch.float32)
    q, k, v, beta = (x.to(dtype) for x in (q, k, v, beta))
    if state is None:
        state = q.new_zeros(B, H, K, V)
    state = state.to(dtype)
    if g is not None:
        state = state * g.to(dtype).exp()[..., None, None]
    # (B, H, V): what the state currently recalls for key k
    recalled = torch.einsum("bhk,bhkv->bhv", k, state)
    delta = beta[..., None] * (v - recalled)
    state = state + k[..., :, None] * delta[..., None, :]
    o = torch.einsum("bhk,bhkv->bhv", q * scale, state)
    return o.to(out_dtype), state
