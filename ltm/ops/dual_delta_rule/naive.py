"""Token-by-token reference of the dual-state delta rule: `dual_delta_rule_step` (step.py, where
the function and its variants are defined) once per token. Slow on purpose: the chunked form
(`chunk.py`) is tested against it, and its default variant against two runs of
`ltm.ops.delta_rule.naive_delta_rule`."""
from __future__ import annotations

import torch

from ltm.ops.dual_delta_rule.step import dual_delta_rule_step, init_dual_state


def naive_dual_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    *,
    fast_read: str = "token",
    slow_threshold: float | None = None,
    chunk_size: int = 64,
    scale: float | None = None,
    state: dict | None = None,
) -> tuple[torch.Tensor, dict]:
    """q, k: [B, T, H, K]; v: [B, T, H, V]; beta, g: [B, T, 2H] (fast states first).
    Returns o [B, T, 2H, V] in the dtype of v and the final state (see step.py)."""
    B, T, H, K = q.shape
    if state is None:
        state = init_dual_state(B, H, K, v.shape[-1], fast_read=fast_read,
                                slow_threshold=slow_threshold, device=q.device,
                                dtype=torch.promote_types(q.dtype, torch.float32))
    outputs = []
    for t in range(T):
        o, state = dual_delta_rule_step(q[:, t], k[:, t], v[:, t], beta[:, t], g[:, t], state,
                                        fast_read=fast_read, slow_threshold=slow_threshold,
                                        chunk_size=chunk_size, scale=scale)
        outputs.append(o)
    o = torch.stack(outputs, dim=1) if outputs else v.new_zeros(B, 0, 2 * H, v.shape[-1])
    return o, state
