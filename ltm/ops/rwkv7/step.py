"""One-token form of the RWKV-7 recurrence, for decoding: the state after T calls equals the
final state of `naive_rwkv7` over the same T tokens."""
from __future__ import annotations

import torch


def _check_step_shapes(r, w, k, v, a, b, state) -> None:
    if r.dim() != 3:
        raise ValueError(f"r must be [B, H, K], got shape {tuple(r.shape)}")
    for name, x in (("w", w), ("k", k), ("a", a), ("b", b)):
        if x.shape != r.shape:
            raise ValueError(f"{name} must be [B, H, K] = {tuple(r.shape)} like r, "
                             f"got {tuple(x.shape)}")
    B, H, K = r.shape
    if v.dim() != 3 or v.shape[:2] != (B, H):
        raise ValueError(f"v must be [B, H, V] with B, H = {(B, H)}, got {tuple(v.shape)}")
    if state is not None and state.shape != (B, H, K, v.shape[-1]):
        raise ValueError(f"state must be [B, H, K, V] = {(B, H, K, v.shape[-1])} or None, "
                         f"got {tuple(state.shape)}")


def rwkv7_step(
    r: torch.Tensor,
    w: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advance the RWKV-7 recurrence by one token.

        S = S * exp(w)[:, None] + b (a^T S) + k v^T;  o = S^T r      (a^T S read before the decay)

    Args:
        r, w, k, a, b: [B, H, K] (w is the log decay, <= 0); v: [B, H, V].
        state: [B, H, K, V] (float32, or float64) or None for zeros.
    Returns:
        o: [B, H, V] in the dtype of v; new state [B, H, K, V] in float32 (float64 for float64
        inputs).
    """
    _check_step_shapes(r, w, k, v, a, b, state)
    B, H, K = r.shape
    V = v.shape[-1]
    out_dtype = v.dtype
    dtype = torch.promote_types(r.dtype, torch.float32)
    r, w, k, v, a, b = (x.to(dtype) for x in (r, w, k, v, a, b))
    if state is None:
        state = r.new_zeros(B, H, K, V)
    state = state.to(dtype)
    # (B, H, V): a^T S, taken before the decay
    sa = torch.einsum("bhk,bhkv->bhv", a, state)
    state = (state * w.exp()[..., None]
             + b[..., :, None] * sa[..., None, :]
             + k[..., :, None] * v[..., None, :])
    o = torch.einsum("bhk,bhkv->bhv", r, state)
    return o.to(out_dtype), state
