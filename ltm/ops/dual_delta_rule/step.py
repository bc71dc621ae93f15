"""One-token form of the dual-state (fast/slow) delta rule, and the state it carries.

Both states read and write the same q, k, v; the fast one is states 0..H-1 of S, the slow one
H..2H-1, each with its own beta and log decay g (beta, g: [B, 2H], fast first). The two variants
the hierarchical DeltaNet can switch on are defined here, token by token (`naive.py` loops this
step; `chunk.py` computes the same function in parallel chunks of `chunk_size` tokens, counted
from position 0 of the sequence):

fast_read="chunk"  the fast state is read only as it stood at the last chunk boundary (decayed
                   to the token): o_t = scale q_t^T exp(G_t) S_fast(chunk start), G_t the
                   in-chunk cumulative log decay up to and including t. The state itself follows
                   the exact delta rule. A pure recurrence over chunks: no intra-chunk attention.
slow_threshold=x   event-driven slow state: inside a chunk the slow state runs the exact delta
                   rule (and is read as it runs); at the chunk's end its update is kept only if
                   the chunk's surprise, sum_t |d_t|^2 / sum_t |beta_t v_t|^2 with d_t the
                   applied delta beta_t (v_t - S^T k_t), is >= x; else it returns to the state
                   it entered the chunk with (no decay, no write). The decision is a hard mask:
                   no gradient flows into the threshold or through the surprise; gradients flow
                   through the updates that were kept and the reads.
Both need the position inside the chunk ("pos", per row) in the state; the other extras:
"R" [B, H, K, V] the fast read state, "commit" [B, H, K, V] the slow state at the last chunk
boundary, "err" and "ref" [B, H] the chunk's surprise sums so far.
"""
from __future__ import annotations

import torch


def has_chunk_state(fast_read: str, slow_threshold: float | None) -> bool:
    """Whether the function depends on chunk boundaries (and the state carries a position)."""
    return fast_read == "chunk" or slow_threshold is not None


def check_variant(fast_read: str, slow_threshold: float | None, chunk_size: int) -> None:
    if fast_read not in ("token", "chunk"):
        raise ValueError(f"fast_read must be 'token' or 'chunk', got {fast_read!r}")
    if slow_threshold is not None and not slow_threshold >= 0:
        raise ValueError(f"slow_threshold must be >= 0 or None, got {slow_threshold!r}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")


def init_dual_state(batch: int, heads: int, key_dim: int, value_dim: int, *, fast_read: str,
                    slow_threshold: float | None, device=None,
                    dtype: torch.dtype = torch.float32) -> dict:
    """Zero state of the dual delta rule: "S" [B, 2H, K, V] and the variants' extras."""
    zeros = lambda *shape: torch.zeros(*shape, device=device, dtype=dtype)
    state = {"S": zeros(batch, 2 * heads, key_dim, value_dim)}
    if has_chunk_state(fast_read, slow_threshold):
        state["pos"] = torch.zeros(batch, dtype=torch.long, device=device)
    if fast_read == "chunk":
        state["R"] = zeros(batch, heads, key_dim, value_dim)
    if slow_threshold is not None:
        state.update(commit=zeros(batch, heads, key_dim, value_dim),
                     err=zeros(batch, heads), ref=zeros(batch, heads))
    return state


def dual_delta_rule_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    state: dict,
    *,
    fast_read: str = "token",
    slow_threshold: float | None = None,
    chunk_size: int = 64,
    scale: float | None = None,
) -> tuple[torch.Tensor, dict]:
    """Advance both states by one token. q, k: [B, H, K]; v: [B, H, V]; beta, g: [B, 2H];
    state: from `init_dual_state` (or a previous call). Returns o [B, 2H, V] (fast heads first)
    in the dtype of v and the new state (float32, float64 for float64 inputs). Only tensor
    operations, no branch on values: one captured CUDA graph serves every position."""
    B, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    dtype = torch.promote_types(q.dtype, torch.float32)
    q, k, v, beta, g = (x.to(dtype) for x in (q, k, v, beta, g))
    q2, k2, v2 = (torch.cat([x, x], dim=1) for x in (q, k, v))
    S = state["S"].to(dtype) * g.exp()[..., None, None]
    # (B, 2H, V): the applied delta of each state
    d = beta[..., None] * (v2 - torch.einsum("bhk,bhkv->bhv", k2, S))
    S = S + k2[..., :, None] * d[..., None, :]
    o = torch.einsum("bhk,bhkv->bhv", q2 * scale, S)
    new = {"S": S}
    if not has_chunk_state(fast_read, slow_threshold):
        return o.to(v.dtype), new
    pos = state["pos"] + 1
    end = (pos % chunk_size == 0)[:, None]  # (B, 1): this token closes its chunk
    new["pos"] = pos
    if fast_read == "chunk":
        R = state["R"].to(dtype) * g[:, :H].exp()[..., None, None]
        o = torch.cat([torch.einsum("bhk,bhkv->bhv", q * scale, R), o[:, H:]], dim=1)
        new["R"] = torch.where(end[..., None, None], S[:, :H], R)
    if slow_threshold is not None:
        err = state["err"].to(dtype) + d[:, H:].square().sum(-1)
        ref = state["ref"].to(dtype) + (beta[:, H:, None] * v).square().sum(-1)
        keep = end & (err >= slow_threshold * ref)  # (B, H)
        commit = torch.where(keep[..., None, None], S[:, H:], state["commit"].to(dtype))
        slow = torch.where(end[..., None, None], commit, S[:, H:])
        new.update(S=torch.cat([S[:, :H], slow], dim=1), commit=commit,
                   err=torch.where(end, 0.0, err), ref=torch.where(end, 0.0, ref))
    return o.to(v.dtype), new
