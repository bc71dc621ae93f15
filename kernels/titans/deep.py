"""The deep Titans memory (two layers, SiLU between) in Triton: the autograd wrapping and the
public op `triton_chunk_titans_deep_memory`. The kernels: `deep_fwd.py` (forward: a sequential
state pass, then the outputs chunk-parallel) and `deep_bwd.py` (backward: chunk-parallel, then
sequential); their formulas are `deep_reference.py`'s.

As for the linear memory (`chunk.py`), the gate products and their gradients to alpha and eta
come from `gates.py`, and forward and backward are custom operators, opaque to torch.compile. The
forward keeps, for the backward, every chunk's entering state ([B, H, NT + 1, ...] per weight and
momentum, slot NT the final state) and z1, d1, d2 and g per token, so that the backward
recomputes nothing sequential.
"""
from __future__ import annotations

import torch

from ltm.kernels.common import block_size, cdiv, check_dtype, check_head_dim, dot_precision, nan_buffer
from ltm.kernels.titans.deep_bwd import _deep_bwd_local_kernel, _deep_bwd_state_kernel
from ltm.kernels.titans.deep_fwd import _deep_output_kernel, _deep_states_kernel
from ltm.kernels.titans.gates import triton_chunk_gates, triton_chunk_gates_bwd
from ltm.ops.titans.memory import TRITON_DEEP_CHUNK_SIZES

DEEP_CHUNK_SIZES = TRITON_DEEP_CHUNK_SIZES  # see ltm.ops.titans.memory
# the widest hidden layer: the kernels walk it in tiles, but a wider one was never run
MAX_HIDDEN = 512


def _dims(q: torch.Tensor, E: int, V: int, chunk: int, sequential: bool) -> dict:
    """The kernels' sizes and launch options. A program's largest live set, a phase of the
    backward state kernel's third pass, holds about six (K or V) x BE float32 tiles of state and
    state gradient. Heads up to 64 walk the hidden layer in tiles of 64 with 8 warps: on an H100
    (K = V = 64, E = 128, chunk 16, bf16) forward+backward 21.9 ms against 24.0 with tiles of 32
    and 4 warps at 8 x 2048 x 12, 51.7 against 65.8 ms at 2 x 8192 x 12 (tiles of 32 with 8
    warps: 26.6 and 70.3; with 4 warps and two stages: 21.6 and 60.9). Wider heads keep tiles of
    32 with 8 warps.

    The sequential kernels multiply in "tf32x3" whatever the input dtype: their products make
    the state, which carries its rounding from chunk to chunk through the non-linear memory. With
    bfloat16 tiles there (`dot_precision`'s "bf16") the final state came out 5e-3 to 7e-3 off the
    float64 token loop (K = V = 64, E = 128, T = 40, CPU interpreter), with "tf32x3" 3e-7; the
    chunk-parallel kernels, whose rounding stays in their chunk, follow `dot_precision`."""
    K = q.shape[-1]
    precision = "tf32x3" if sequential else dot_precision(q.dtype, K)
    hidden_tile = 64 if max(K, V) <= 64 else 32
    return dict(H=q.shape[2], K=K, E=E, V=V, BT=chunk, BK=block_size(K),
                BE=min(block_size(E), hidden_tile), BV=block_size(V), PRECISION=precision,
                num_warps=8, num_stages=1)


def _states(B: int, H: int, NT: int, K: int, E: int, V: int, dev: torch.device) -> list:
    """W1, S1 [B, H, NT + 1, K, E] and W2, S2 [B, H, NT + 1, E, V], float32."""
    return [nan_buffer((B, H, NT + 1, *shape), torch.float32, dev)
            for shape in ((K, E), (K, E), (E, V), (E, V))]


@torch.library.custom_op("ltm::titans_deep_memory_fwd", mutates_args=())
def _deep_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, theta: torch.Tensor,
              alpha: torch.Tensor, eta: torch.Tensor, w1: torch.Tensor, s1: torch.Tensor,
              w2: torch.Tensor, s2: torch.Tensor, chunk: int, clip: float
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                         torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                         torch.Tensor, torch.Tensor, torch.Tensor]:
    """o, the final W1, S1, W2, S2, and for the backward the four state buffers and the token
    buffers z1, d1, d2, g."""
    B, T, H, K = q.shape
    E, V, NT = w1.shape[-1], v.shape[-1], cdiv(T, chunk)
    dev = q.device
    states = _states(B, H, NT, K, E, V, dev)
    for buf, x in zip(states, (w1, s1, w2, s2)):
        buf[:, :, 0] = x
    rows = NT * chunk
    z1, d1 = (nan_buffer((B, H, rows, E), torch.float32, dev) for _ in range(2))
    d2 = nan_buffer((B, H, rows, V), torch.float32, dev)
    g = nan_buffer((B, H, rows), torch.float32, dev)
    o = v.new_empty(v.shape)
    a, b, gamma, ends, w_last, p_last = triton_chunk_gates(alpha, eta, chunk)
    _deep_states_kernel[(B * H,)](k, v, theta, ends, w_last, p_last, *states, z1, d1, d2, g, T, NT,
                                  clip or 1.0, USE_CLIP=clip > 0, **_dims(q, E, V, chunk, True))
    _deep_output_kernel[(NT, B * H)](q, k, a, b, gamma, *states, z1, d1, d2, g, o, T, NT,
                                     **_dims(q, E, V, chunk, False))
    # the final state is slot NT, copied: a custom operator's outputs may not alias each other,
    # and the backward then takes its gradient alone, not a buffer-sized one
    return (o, *(x[:, :, NT].clone() for x in states), *states, z1, d1, d2, g)


@_deep_fwd.register_fake
def _(q, k, v, theta, alpha, eta, w1, s1, w2, s2, chunk, clip):
    B, T, H, K = q.shape
    E, V, NT = w1.shape[-1], v.shape[-1], cdiv(T, chunk)
    f32 = dict(dtype=torch.float32)
    states = [q.new_empty((B, H, NT + 1, *shape), **f32) for shape in ((K, E), (K, E), (E, V), (E, V))]
    rows = NT * chunk
    finals = [x[:, :, 0].clone() for x in states]
    return (v.new_empty(v.shape), *finals, *states, q.new_empty((B, H, rows, E), **f32),
            q.new_empty((B, H, rows, E), **f32), q.new_empty((B, H, rows, V), **f32),
            q.new_empty((B, H, rows), **f32))


@torch.library.custom_op("ltm::titans_deep_memory_bwd", mutates_args=())
def _deep_bwd(q: torch.Tensor, k: torch.Tensor, theta: torch.Tensor, alpha: torch.Tensor,
              eta: torch.Tensor, w1: torch.Tensor, s1: torch.Tensor, w2: torch.Tensor,
              s2: torch.Tensor, z1: torch.Tensor, d1: torch.Tensor, d2: torch.Tensor,
              g: torch.Tensor, do: torch.Tensor, dw1t: torch.Tensor, ds1t: torch.Tensor,
              dw2t: torch.Tensor, ds2t: torch.Tensor, chunk: int, clip: float
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                         torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of q, k, v, theta, alpha, eta and the initial W1, S1, W2, S2, given dO and
    the final state's gradients (see deep_bwd.py); w1 .. s2 are the forward's state buffers."""
    B, T, H, K = q.shape
    E, V, NT = w1.shape[-1], do.shape[-1], cdiv(T, chunk)
    dev, rows = q.device, NT * chunk
    gates = triton_chunk_gates(alpha, eta, chunk)  # recomputed: [B, H, T, BT] at most
    a, b, gamma, ends, w_last, p_last = gates
    da, db, dgamma, dends, dw_last, dp_last = (torch.empty_like(x) for x in gates)
    dq, dk = (x.new_empty(x.shape) for x in (q, k))
    dv = do.new_empty(do.shape)
    dtheta = torch.empty((B, T, H), dtype=torch.float32, device=dev)
    dstates = _states(B, H, NT, K, E, V, dev)
    for buf, x in zip(dstates, (dw1t, ds1t, dw2t, ds2t)):
        buf[:, :, NT] = x  # the final state's gradient enters the last chunk
    dk_buf = nan_buffer((B, H, rows, K), torch.float32, dev)
    dd1, dh1 = (nan_buffer((B, H, rows, E), torch.float32, dev) for _ in range(2))
    dd2 = nan_buffer((B, H, rows, V), torch.float32, dev)
    dg = nan_buffer((B, H, rows), torch.float32, dev)
    do = do.contiguous()
    states = (w1, s1, w2, s2)
    _deep_bwd_local_kernel[(NT, B * H)](
        q, k, do, a, b, gamma, *states, z1, d1, d2, g, dq, da, db, dgamma, dg, dk_buf, dd1, dh1,
        dd2, *dstates, T, NT, **_dims(q, E, V, chunk, False))
    _deep_bwd_state_kernel[(B * H,)](
        k, theta, ends, w_last, p_last, *states, z1, d1, d2, g, dg, dk_buf, dd1, dh1, dd2,
        *dstates, dk, dv, dtheta, dends, dw_last, dp_last, T, NT, clip or 1.0,
        USE_CLIP=clip > 0, **_dims(q, E, V, chunk, True))
    dalpha, deta = triton_chunk_gates_bwd(alpha, eta, chunk, (da, db, dgamma, dends, dw_last,
                                                              dp_last), gamma)
    return (dq, dk, dv, dtheta.to(theta.dtype), dalpha, deta,
            *(x[:, :, 0].contiguous() for x in dstates))


@_deep_bwd.register_fake
def _(q, k, theta, alpha, eta, w1, s1, w2, s2, z1, d1, d2, g, do, dw1t, ds1t, dw2t, ds2t, chunk,
      clip):
    B, T, H, K = q.shape
    E, V = w1.shape[-1], do.shape[-1]
    layer1 = q.new_empty((B, H, K, E), dtype=torch.float32)
    layer2 = q.new_empty((B, H, E, V), dtype=torch.float32)
    return (*(x.new_empty(x.shape) for x in (q, k, do, theta, alpha, eta)), layer1,
            torch.empty_like(layer1), layer2, torch.empty_like(layer2))


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, theta, alpha, eta, *_, chunk, clip = inputs
    ctx.save_for_backward(q, k, theta, alpha, eta, *output[5:])
    ctx.options = (chunk, clip)


def _backward(ctx, do, dw1, ds1, dw2, ds2, *_):
    q, k, theta, alpha, eta, *saved = ctx.saved_tensors
    chunk, clip = ctx.options
    finals = [torch.zeros_like(s[:, :, -1]) if x is None else x.float().contiguous()
              for x, s in zip((dw1, ds1, dw2, ds2), saved[:4])]
    grads = _deep_bwd(q, k, theta, alpha, eta, *saved, do, *finals, chunk, clip)
    return (*grads, None, None)


_deep_fwd.register_autograd(_backward, setup_context=_setup_context)


def _check(q, k, v, theta, alpha, eta, state, chunk_size) -> None:
    if q.dim() != 4 or q.shape[1] < 1 or k.shape != q.shape:
        raise ValueError(f"q and k must be [B, T, H, K] alike with T >= 1, got {tuple(q.shape)} "
                         f"and {tuple(k.shape)}")
    B, T, H, K = q.shape
    if v.dim() != 4 or tuple(v.shape[:3]) != (B, T, H):
        raise ValueError(f"v must be [B, T, H, V] with B, T, H = {(B, T, H)}, got {tuple(v.shape)}")
    for name, x in (("theta", theta), ("alpha", alpha), ("eta", eta)):
        if tuple(x.shape) != (B, T, H):
            raise ValueError(f"{name} must be [B, T, H] = {(B, T, H)}, got {tuple(x.shape)}")
    for name, x in (("k", k), ("v", v)):
        check_dtype(name, x, q.dtype)
    check_head_dim("q/k", K)
    check_head_dim("v", v.shape[-1])
    E = state[0].shape[-1] if state[0].dim() == 4 else -1
    if not 1 <= E <= MAX_HIDDEN:
        raise ValueError(f"the hidden width must be in [1, {MAX_HIDDEN}], got w1 of shape "
                         f"{tuple(state[0].shape)}")
    for name, x, shape in zip(("w1", "s1", "w2", "s2"), state,
                              ((K, E), (K, E), (E, v.shape[-1]), (E, v.shape[-1]))):
        if tuple(x.shape) != (B, H, *shape):
            raise ValueError(f"{name} must be {list((B, H, *shape))}, got {list(x.shape)}")
    if chunk_size not in DEEP_CHUNK_SIZES:
        raise ValueError(f"chunk_size must be one of {DEEP_CHUNK_SIZES} for the deep memory's "
                         f"Triton kernel, got {chunk_size!r}; use kernel 'torch'")


def triton_chunk_titans_deep_memory(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    theta: torch.Tensor,
    alpha: torch.Tensor,
    eta: torch.Tensor,
    weights: tuple[torch.Tensor, torch.Tensor],
    momenta: tuple[torch.Tensor, torch.Tensor],
    *,
    chunk_size: int,
    grad_clip: float | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, tuple | None, tuple | None]:
    """The deep Titans memory (W1 [K, E], SiLU, W2 [E, V]) over a sequence whose first token
    starts a chunk.

    q, k: [B, T, H, K]; v: [B, T, H, V] (one dtype); theta, alpha, eta: [B, T, H]; weights and
    momenta: (W1 [B, H, K, E], W2 [B, H, E, V]) before the first token (float32;
    differentiable). Returns o [B, T, H, V] in v's dtype and, when `output_final_state`, the
    weights and momenta after the last token (float32), else None, None.
    """
    state = (weights[0], momenta[0], weights[1], momenta[1])
    _check(q, k, v, theta, alpha, eta, state, chunk_size)
    q, k, v, theta, alpha, eta = (x.contiguous() for x in (q, k, v, theta, alpha, eta))
    o, w1, s1, w2, s2, *_ = _deep_fwd(q, k, v, theta, alpha, eta,
                                      *(x.float().contiguous() for x in state), chunk_size,
                                      float(grad_clip or 0.0))
    if not output_final_state:
        return o, None, None
    return o, (w1, w2), (s1, s2)
