"""One-token form of the Titans memory, for decoding: T calls from a state equal the sequence
forms over the same T tokens with the same chunk_size (the state remembers where the current
chunk started, and its starting weights)."""
from __future__ import annotations

from typing import Sequence

import torch

from ltm.ops.titans.memory import (TitansState, check_options, check_state, check_weights,
                                   init_titans_state, memory_grads, memory_read)


def _check_step_shapes(q, k, v, theta, alpha, eta) -> None:
    if q.dim() != 3:
        raise ValueError(f"q must be [B, H, K], got shape {tuple(q.shape)}")
    B, H, K = q.shape
    if k.shape != q.shape:
        raise ValueError(f"k must be [B, H, K] = {(B, H, K)} like q, got {tuple(k.shape)}")
    if v.dim() != 3 or v.shape[:2] != (B, H):
        raise ValueError(f"v must be [B, H, V] with B, H = {(B, H)}, got {tuple(v.shape)}")
    for name, x in (("theta", theta), ("alpha", alpha), ("eta", eta)):
        if x.shape != (B, H):
            raise ValueError(f"{name} must be [B, H] = {(B, H)}, got {tuple(x.shape)}")


def _at_chunk_start(pos, chunk_size: int, weights: tuple, chunk_weights: tuple) -> tuple:
    """The weights the token at `pos` takes its gradient at: the current ones where a chunk
    starts, else the chunk's stored start. `pos` an int, or a (B,) tensor (row by row, with no
    host sync, so a captured decoding step serves every position)."""
    if not torch.is_tensor(pos):
        return weights if pos % chunk_size == 0 else chunk_weights
    start = (pos % chunk_size == 0)[:, None, None, None]
    return tuple(torch.where(start, w, c) for w, c in zip(weights, chunk_weights))


def titans_memory_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    theta: torch.Tensor,
    alpha: torch.Tensor,
    eta: torch.Tensor,
    weights: Sequence[torch.Tensor],
    state: TitansState | None = None,
    *,
    chunk_size: int = 64,
    grad_clip: float | None = None,
) -> tuple[torch.Tensor, TitansState]:
    """Advance the memory by one token: the gradient at the current chunk's starting weights
    (the current weights when chunk_size is 1), the momentum and forgetting updates, the read.

    q, k: [B, H, K]; v: [B, H, V]; theta, alpha, eta: [B, H]; weights: the initial memory,
    [H, d_in, d_out] per layer (used when state is None); state.pos an int or a (B,) tensor.
    Returns o [B, H, V] in the dtype of v and the new state.
    """
    _check_step_shapes(q, k, v, theta, alpha, eta)
    check_weights(weights, q.shape[1], q.shape[2], v.shape[-1])
    check_state(state, weights, q.shape[0], tensor_pos=True)
    check_options(chunk_size, grad_clip)
    dtype, out_dtype = torch.promote_types(q.dtype, torch.float32), v.dtype
    state = state or init_titans_state(weights, q.shape[0], dtype)
    W, S, W_grad = (tuple(x.to(dtype) for x in part) for part in state[:3])
    W_grad = _at_chunk_start(state.pos, chunk_size, W, W_grad)
    # [B, H, 1, D]: one token as a chunk of one
    q, k, v = (x.to(dtype)[:, :, None] for x in (q, k, v))
    theta, alpha, eta = (x.to(dtype)[..., None, None] for x in (theta, alpha, eta))
    # float32 (float64) state also under autocast
    with torch.autocast(q.device.type, enabled=False):
        xs, deltas, clip = memory_grads(W_grad, k, v, grad_clip)
        g = theta * clip[..., None]
        S = tuple(eta * s - g * x.transpose(-1, -2) @ d for s, x, d in zip(S, xs, deltas))
        W = tuple((1 - alpha) * w + s for w, s in zip(W, S))
        o = memory_read(W, q)[:, :, 0]
    pos = state.pos + 1
    return o.to(out_dtype), TitansState(W, S, _at_chunk_start(pos, chunk_size, W, W_grad), pos)
