"""The (gated) delta rule, every implementation reached from here.

    S = S * exp(g_t);  S = S + beta_t k_t (v_t - S^T k_t)^T;  o_t = S^T (scale q_t)

Entry points (what the layers call; `kernel` picks the implementation, see `ltm.ops`):
    delta_rule(q, k, v, beta, g, *, kernel, chunk_size, initial_state, output_final_state)
        a sequence: q, k [B, T, H, K]; v [B, T, H, V]; beta, g [B, T, H]
    delta_rule_one_token(q, k, v, beta, g, state, *, kernel)
        one decoding step: q, k [B, H, K]; v [B, H, V]; beta, g [B, H]
States are [B, H, K, V], float32 (float64 for float64 inputs).

Implementations: `naive_delta_rule` (naive.py), `chunk_delta_rule` (chunk.py) and
`delta_rule_step` (step.py) in PyTorch; `ltm.kernels.delta_rule.triton_chunk_delta_rule` and
`triton_delta_rule_step` in Triton; fla's `chunk_gated_delta_rule`.
"""
from __future__ import annotations

from types import ModuleType

import torch

from ltm.ops import check_kernel, unknown_kernel
from ltm.ops.auto import AUTO, choose, one_token_kernel
from ltm.ops.delta_rule.chunk import chunk_delta_rule
from ltm.ops.delta_rule.naive import naive_delta_rule
from ltm.ops.delta_rule.step import delta_rule_step

__all__ = ["chunk_delta_rule", "delta_rule", "delta_rule_one_token", "delta_rule_step",
           "naive_delta_rule"]


def _lazy_path(kernel: str) -> ModuleType:
    """The module of the "triton" or "fla" implementation, imported on first use: the naive and
    torch paths (and every CPU test of them) never load Triton, TRITON_INTERPRET may still be set
    before the first kernel is built, and fla stays optional (a one-line error when missing)."""
    check_kernel(kernel)
    if kernel == "triton":
        from ltm.kernels import delta_rule as triton_path
        return triton_path
    from fla.ops import gated_delta_rule as fla_path
    return fla_path


def delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    *,
    kernel: str,
    chunk_size: int,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule over a sequence by the implementation `kernel` names.

    q, k: [B, T, H, K]; v: [B, T, H, V]; beta, g: [B, T, H] (g the log decay, <= 0).
    initial_state: [B, H, K, V] or None (zeros). chunk_size: tokens per chunk of the torch form
    (the Triton and fla kernels use their own). Returns o [B, T, H, V] in the dtype of v, and the
    final state [B, H, K, V] (float32) when `output_final_state`, else None.
    """
    if kernel == AUTO:
        # fla's gated entry takes a g; without one only ours computes the plain delta rule
        kernel = choose("delta_rule", q, v, (q, k, v, beta, g, initial_state),
                        candidates=("triton", "fla") if g is not None else ("triton",))
    if kernel == "naive":
        return naive_delta_rule(q, k, v, beta, g, initial_state=initial_state,
                                output_final_state=output_final_state)
    if kernel == "torch":
        return chunk_delta_rule(q, k, v, beta, g, initial_state=initial_state,
                                output_final_state=output_final_state, chunk_size=chunk_size)
    if kernel == "triton":
        # the kernels take q, k, v, beta in one dtype (under bf16 autocast the normalised q, k
        # come out float32, v bf16); g may stay float32
        q, k, beta = q.to(v.dtype), k.to(v.dtype), beta.to(v.dtype)
        return _lazy_path(kernel).triton_chunk_delta_rule(
            q, k, v, beta, g, initial_state=initial_state, output_final_state=output_final_state)
    if kernel == "fla":
        q, k, beta = q.to(v.dtype), k.to(v.dtype), beta.to(v.dtype)
        # fla takes g before beta and expects float32 states; its scale default is also K ** -0.5
        return _lazy_path(kernel).chunk_gated_delta_rule(
            q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state,
            output_final_state=output_final_state)
    raise unknown_kernel(kernel)


def delta_rule_one_token(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    state: torch.Tensor | None,
    *,
    kernel: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step of the gated delta rule by the implementation `kernel` names.

    q, k: [B, H, K]; v: [B, H, V]; beta, g: [B, H]; state: [B, H, K, V] or None (zeros).
    Returns o [B, H, V] in the dtype of v and the new state [B, H, K, V] (float32).
    "torch" and "fla" both run `delta_rule_step`: one token is a few small batched matmuls.
    """
    if kernel == AUTO:
        kernel = one_token_kernel(v.device)
    if kernel == "naive":
        o, state = naive_delta_rule(q[:, None], k[:, None], v[:, None], beta[:, None], g[:, None],
                                    initial_state=state, output_final_state=True)
        return o[:, 0], state
    if kernel == "triton":
        return _lazy_path(kernel).triton_delta_rule_step(
            q.to(v.dtype), k.to(v.dtype), v, beta.to(v.dtype), g, scale=q.shape[-1] ** -0.5,
            state=state)
    if kernel in ("torch", "fla"):
        return delta_rule_step(q, k, v, beta, g, scale=q.shape[-1] ** -0.5, state=state)
    raise unknown_kernel(kernel)
