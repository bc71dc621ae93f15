"""The dual-state (fast/slow) delta rule of the hierarchical DeltaNet, every implementation
reached from here. Two gated delta rules over the same q, k, v, each with its own beta and decay:

    S_f = S_f exp(g_f,t) + ...,  S_s = S_s exp(g_s,t) + ...   (see ltm.ops.delta_rule)

and, optionally, the variants defined in step.py (the fast state read only at chunk boundaries;
the event-driven slow state). With neither it is the stacked path of the layer, `delta_rule` on
q, k, v concatenated twice along the heads, computed without the copies.

Entry points:
    dual_delta_rule(q, k, v, beta, g, *, kernel, chunk_size, fast_read, slow_threshold,
                    state, output_final_state)
        q, k [B, T, H, K]; v [B, T, H, V]; beta, g [B, T, 2H] (fast states first)
    dual_delta_rule_one_token(q, k, v, beta, g, state, *, chunk_size, fast_read, slow_threshold)
        q, k [B, H, K]; v [B, H, V]; beta, g [B, 2H]
States are dicts (`init_dual_state`): "S" [B, 2H, K, V] float32, the variants' extras.

Implementations: `naive_dual_delta_rule` (naive.py, kernel "naive"); `chunk_dual_delta_rule`
(chunk.py, kernels "torch" and "fla", and the variants on every kernel); without variants, kernel
"triton" runs `ltm.kernels.delta_rule.triton_chunk_delta_rule` with grouped heads: both states of a
head over one q, k, v in the Triton kernels, no copies (the variants' chunk-level state has no
Triton kernel). "auto" is "triton" on CUDA (fla has no form of its own here), "torch" elsewhere.
"""
from __future__ import annotations

import torch

from ltm.ops import check_kernel
from ltm.ops.auto import AUTO, choose
from ltm.ops.dual_delta_rule.chunk import chunk_dual_delta_rule
from ltm.ops.dual_delta_rule.naive import naive_dual_delta_rule
from ltm.ops.dual_delta_rule.step import (check_variant, dual_delta_rule_step, has_chunk_state,
                                          init_dual_state)

__all__ = ["chunk_dual_delta_rule", "dual_delta_rule", "dual_delta_rule_one_token",
           "dual_delta_rule_step", "init_dual_state", "naive_dual_delta_rule"]


def _chunk_offset(state: dict | None, chunk_size: int) -> int:
    """Tokens already in the current chunk of a continued state (all rows at the same point)."""
    if state is None or "pos" not in state:
        return 0
    pos = state["pos"] % chunk_size
    if bool((pos != pos[0]).any()):
        raise ValueError("state: rows at different positions inside their chunk cannot be "
                         "continued by one sequence call; decode them token by token")
    return int(pos[0])


def dual_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    *,
    kernel: str,
    chunk_size: int,
    fast_read: str = "token",
    slow_threshold: float | None = None,
    state: dict | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, dict | None]:
    """Dual-state delta rule over a sequence. Returns o [B, T, 2H, V] in the dtype of v (fast
    heads first) and the final state when `output_final_state`, else None. A state that stopped
    inside a chunk (the variants count chunks from position 0) is first stepped token by token to
    the chunk's end, then the chunked form takes the rest."""
    check_kernel(kernel)
    check_variant(fast_read, slow_threshold, chunk_size)
    if kernel == AUTO:
        # fla's name runs the chunked PyTorch form here: ours is the only kernel to measure
        kernel = choose("dual_delta_rule", q, v, (q, k, v, beta, g), candidates=("triton",))
    variant = dict(fast_read=fast_read, slow_threshold=slow_threshold, chunk_size=chunk_size)
    if kernel == "naive":
        o, state = naive_dual_delta_rule(q, k, v, beta, g, state=state, **variant)
        return o, (state if output_final_state else None)
    if kernel == "triton" and not has_chunk_state(fast_read, slow_threshold):
        return _triton_dual(q, k, v, beta, g, state, output_final_state)
    head = []
    offset = _chunk_offset(state, chunk_size) if has_chunk_state(fast_read, slow_threshold) else 0
    if offset:
        n = min(q.shape[1], chunk_size - offset)
        o, state = naive_dual_delta_rule(q[:, :n], k[:, :n], v[:, :n], beta[:, :n], g[:, :n],
                                         state=state, **variant)
        head, (q, k, v, beta, g) = [o], (x[:, n:] for x in (q, k, v, beta, g))
        if q.shape[1] == 0:
            return o, (state if output_final_state else None)
    o, state = chunk_dual_delta_rule(q, k, v, beta, g, state=state,
                                     output_final_state=output_final_state, **variant)
    return (torch.cat(head + [o], dim=1) if head else o), state


def _triton_dual(q, k, v, beta, g, state: dict | None, output_final_state: bool):
    """Both states in the Triton kernels, grouped heads (state j reads q, k, v head j mod H)."""
    # imported here: the kernels import Triton, which the CPU paths of this op never need
    from ltm.kernels.delta_rule import triton_chunk_delta_rule
    # one dtype for the kernels, as `ltm.ops.delta_rule.delta_rule` gives them (bf16 autocast
    # leaves the normalised q, k float32)
    q, k, beta = q.to(v.dtype), k.to(v.dtype), beta.to(v.dtype)
    initial = None if state is None else state["S"]
    o, S = triton_chunk_delta_rule(q, k, v, beta, g, initial_state=initial,
                                   output_final_state=output_final_state)
    return o, ({"S": S} if output_final_state else None)


def dual_delta_rule_one_token(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    state: dict,
    *,
    chunk_size: int,
    fast_read: str = "token",
    slow_threshold: float | None = None,
) -> tuple[torch.Tensor, dict]:
    """One decoding step (every kernel: one token is a few small batched matmuls).
    Returns o [B, 2H, V] and the new state."""
    return dual_delta_rule_step(q, k, v, beta, g, state, fast_read=fast_read,
                                slow_threshold=slow_threshold, chunk_size=chunk_size)
