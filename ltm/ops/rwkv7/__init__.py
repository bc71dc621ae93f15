"""The RWKV-7 recurrence (the generalized delta rule), every implementation reached from here.

    S = S * exp(w_t)[:, None] + b_t (a_t^T S) + k_t v_t^T   (a_t^T S read before the decay)
    o_t = S^T r_t

Entry points (what the layers call; `kernel` picks the implementation, see `ltm.ops`):
    rwkv7(r, w, k, v, a, b, *, kernel, chunk_size, initial_state, output_final_state)
        a sequence: r, w, k, a, b [B, T, H, K]; v [B, T, H, V]
    rwkv7_one_token(r, w, k, v, a, b, state, *, kernel)
        one decoding step: r, w, k, a, b [B, H, K]; v [B, H, V]
States are [B, H, K, V], float32 (float64 for float64 inputs).

Implementations: `naive_rwkv7` (naive.py), `chunk_rwkv7` (chunk.py) and `rwkv7_step` (step.py)
in PyTorch; `ltm.kernels.rwkv7.triton_chunk_rwkv7` and `triton_rwkv7_step` in Triton (and
`triton_fused_recurrent_rwkv7`, a token loop the tests and benchmarks check the chunked kernel
against); fla's `chunk_rwkv7`.
"""
from __future__ import annotations

from types import ModuleType

import torch

from ltm.ops import check_kernel, unknown_kernel
from ltm.ops.auto import AUTO, choose, one_token_kernel
from ltm.ops.rwkv7.chunk import chunk_rwkv7
from ltm.ops.rwkv7.naive import naive_rwkv7
from ltm.ops.rwkv7.step import rwkv7_step

__all__ = ["RWKV7_MAX_CHUNK", "chunk_rwkv7", "torch_chunk_size", "naive_rwkv7", "rwkv7", "rwkv7_one_token",
           "rwkv7_step"]

# the torch chunk form of RWKV-7 uses chunks of at most this many tokens
RWKV7_MAX_CHUNK = 16


def torch_chunk_size(chunk_size: int, head_dim: int, device: torch.device) -> int:
    """Tokens per chunk of the torch form: its (C, C, K) pair-decay tensor grows with the square
    of the chunk (at T=1024, D=32 on a CPU chunks of 16 ran 3.9x faster than chunks of 64), so
    chunk_size is capped at RWKV7_MAX_CHUNK, and on a CPU further by head size, as measured
    there (one thread, forward+backward, 2026-12-06): heads of 16 at chunk 4 (the recall model's
    training step 72 ms against 90 at 16), larger heads at 8 (T 1024: 115 ms against 135 at D 32,
    276 against 351 at D 64)."""
    cap = RWKV7_MAX_CHUNK if device.type != "cpu" else 4 if head_dim <= 16 else 8
    return min(chunk_size, cap)


def _lazy_path(kernel: str) -> ModuleType:
    """The module of the "triton" or "fla" implementation, imported on first use: the naive and
    torch paths (and every CPU test of them) never load Triton, TRITON_INTERPRET may still be set
    before the first kernel is built, and fla stays optional (a one-line error when missing)."""
    check_kernel(kernel)
    if kernel == "triton":
        from ltm.kernels import rwkv7 as triton_path
        return triton_path
    from fla.ops import rwkv7 as fla_path
    return fla_path


def rwkv7(
    r: torch.Tensor,
    w: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    kernel: str,
    chunk_size: int,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RWKV-7 recurrence over a sequence by the implementation `kernel` names.

    r, w, k, a, b: [B, T, H, K] (w the log decay, <= 0); v: [B, T, H, V]. initial_state:
    [B, H, K, V] or None (zeros). chunk_size: tokens per chunk of the torch form, capped by
    torch_chunk_size (the Triton and fla kernels use their own). Returns o [B, T, H, V] in the
    dtype of v, and the final state [B, H, K, V] (float32) when `output_final_state`, else None.
    """
    if kernel == AUTO:
        kernel = choose("rwkv7", r, v, (r, w, k, v, a, b, initial_state),
                        candidates=("triton", "fla"))
    if kernel == "naive":
        return naive_rwkv7(r, w, k, v, a, b, initial_state=initial_state,
                           output_final_state=output_final_state)
    if kernel == "torch":
        return chunk_rwkv7(r, w, k, v, a, b, initial_state=initial_state,
                           output_final_state=output_final_state,
                           chunk_size=torch_chunk_size(chunk_size, r.shape[-1], r.device))
    if kernel == "triton":
        # the kernels take all six inputs in one dtype (bf16 under autocast, where w, a, b are
        # float32)
        r, w, k, a, b = (x.to(v.dtype) for x in (r, w, k, a, b))
        return _lazy_path(kernel).triton_chunk_rwkv7(
            r, w, k, v, a, b, initial_state=initial_state, output_final_state=output_final_state)
    if kernel == "fla":
        r, w, k, a, b = (x.to(v.dtype) for x in (r, w, k, a, b))
        # fla's w is the log decay too and a^T S is read before the decay, as in naive_rwkv7
        return _lazy_path(kernel).chunk_rwkv7(
            r=r, w=w, k=k, v=v, a=a, b=b, scale=1.0, initial_state=initial_state,
            output_final_state=output_final_state)
    raise unknown_kernel(kernel)


def rwkv7_one_token(
    r: torch.Tensor,
    w: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    state: torch.Tensor | None,
    *,
    kernel: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step of the RWKV-7 recurrence by the implementation `kernel` names.

    r, w, k, a, b: [B, H, K]; v: [B, H, V]; state: [B, H, K, V] or None (zeros). Returns
    o [B, H, V] in the dtype of v and the new state [B, H, K, V] (float32).
    "torch" and "fla" both run `rwkv7_step`: one token is a few small batched matmuls.
    """
    if kernel == AUTO:
        kernel = one_token_kernel(v.device)
    if kernel == "naive":
        o, state = naive_rwkv7(*(x[:, None] for x in (r, w, k, v, a, b)),
                               initial_state=state, output_final_state=True)
        return o[:, 0], state
    if kernel == "triton":
        return _lazy_path(kernel).triton_rwkv7_step(
            *(x.to(v.dtype) for x in (r, w, k)), v, *(x.to(v.dtype) for x in (a, b)), state=state)
    if kernel in ("torch", "fla"):
        return rwkv7_step(r, w, k, v, a, b, state=state)
    raise unknown_kernel(kernel)
