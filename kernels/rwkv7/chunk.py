"""RWKV-7 recurrence in Triton, chunked (chunk-parallel): the launchers, the autograd Function and
the public op `triton_chunk_rwkv7`. The kernels are in `chunk_fwd.py` and `chunk_bwd.py`; every
launch choice (chunk, FAST_SPAN, value blocks, warps, tile precision) is made here: a short list of
configurations per kernel and shape class, default first, which `ltm.kernels.tuning` times once
per class on a GPU (the interpreter runs the default).

Per token t, state S of shape [K, V], w_t the log decay (<= 0), a_t^T S read before the decay:
    s_t = S_{t-1}^T a_t;  S_t = diag(exp(w_t)) S_{t-1} + b_t s_t^T + k_t v_t^T;  o_t = S_t^T r_t
Per chunk of C tokens, with W_i the inclusive in-chunk cumulative log decay (per channel),
E_i = W_i - w_i the exclusive one and S0 the state entering the chunk, the pair matrices
    A_ab[i, j] = sum_c a_i b_j exp(E_i - W_j)  (j < i),   A_ak likewise with k_j,
    A_rb[i, j] = sum_c r_i b_j exp(W_i - W_j)  (j <= i),  A_rk likewise with k_j
are products of r exp(W), a exp(E) with b exp(-W), k exp(-W) where the chunk's decay span is
below FAST_SPAN, else built column by column from exp(W_i - W_j) itself (exponents <= 0, so any
decay is exact); the backward's pair sums likewise. Then
    L = I - A_ab,  s = X + Y S0  with  X = L^-1 A_ak V,  Y = L^-1 (a exp(E)),
    o = (r exp(W)) S0 + A_rb s + A_rk V,
    S_C = exp(W_last) S0 + (b exp(W_last - W))^T s + (k exp(W_last - W))^T V.
The backward carries Gc, the gradient of the state leaving a chunk from the tokens after it:
    P = L^-T (A_rb^T dO + (b exp(W_last - W)) Gc)          (P_i = G_i^T b_i; the forward's
                                                            prep saves A_rb L^-1 and L^-T Bbar)
    Gc <- exp(W_last) Gc + (r exp(W))^T dO + (a exp(E))^T P
and per token dr = S_t do, dk = G_t v, dv = G_t^T k, db = G_t s, da = S_{t-1} p, each a state
term plus in-chunk pair sums weighted by exp(W_i - W_j). dw_t = exp(w_t) sum_v S_{t-1} G_t (per
channel) is, by the same expansion, the sum over the (source, sink) pairs that straddle token t:
sources S0, b_j s_j^T and k_j v_j^T for j < t, sinks Gc, r_i do_i^T for i >= t and a_i p_i^T for
i > t; each pair's product is a term of dr, da, dk or db already formed, so dw is gathered from
them directly. (The shorter identity dw_t = sum_{t' >= t} (r dr - b db - k dk + a_{t'+1} da_{t'+1}),
plus the final state's term, cancels heavily under strong decay: 1e-2 against 3e-3 in bf16. The
tensor-core path uses it for the in-chunk pairs only, where the decay is weak by construction.)
Kernels (chunk_fwd.py, then chunk_bwd.py): `_prep_fwd_kernel` (chunk-parallel: pair matrices, L^-1, X, Y, ...), `_fwd_state_kernel`
(sequential over chunks: entering states and s), `_output_kernel` (chunk-parallel: o),
`_bwd_state_kernel` (sequential, backwards: Gc and P), `_bwd_grad_kernel` (chunk-parallel: every
input gradient; launched once per in-chunk path, each program skipping the other path's chunks).
Tested against `ltm.ops.rwkv7.naive.naive_rwkv7`.
"""
from __future__ import annotations

import torch

from ltm.kernels import tuning
from ltm.kernels.common import (block_size, cdiv, check_rwkv7_inputs, dot_precision, intermediate_dtype,
                                nan_buffer)
from ltm.kernels.delta_rule.chunk import _sm_count
from ltm.kernels.rwkv7.chunk_bwd import _bwd_grad_kernel, _bwd_state_kernel
from ltm.kernels.rwkv7.chunk_fwd import _fwd_state_kernel, _output_kernel, _prep_fwd_kernel


# Tokens per chunk: one 16 x 16 block per chunk keeps every in-chunk matrix one tensor-core tile.
# The kernels take it as a constexpr; 32 and 64 pass the tests under the interpreter too (L^-1 then
# by forward substitution), but their (C, K) float32 tiles spill on a GPU (untimed).
CHUNK = 16
# Chunks whose decay span, max over channels of -sum(w), is below this take the tensor-core path:
# pair matrices and pair sums as products of r exp(W), a exp(E) with b exp(-W), k exp(-W), whose
# factors stay within exp(+-FAST_SPAN) (no overflow, no underflow to subnormals). RWKV-7's own
# decays (log decay -exp(-0.5) sigmoid(.) >= -0.61 per token) always do at 16 tokens; stronger
# chunks take the exact column loops.
FAST_SPAN = 40.0


def _shape_class(B: int, T: int, H: int, K: int, V: int, precision: str, device) -> tuple:
    """What the launch choices depend on (as in the delta rule's launcher): head sizes, tile
    precision, chunks per sequence and B H rounded up to powers of two, the SM count."""
    return (K, V, precision, tuning.bucket(cdiv(T, CHUNK), 4096), tuning.bucket(B * H, 1024),
            _sm_count(device))


@tuning.per_class
def _sequential_configs(shape_class: tuple) -> list:
    """`_fwd_state_kernel` and `_bwd_state_kernel`, which walk the chunks in order carrying only the
    (BK, BV) state, so the next chunk's tiles can be loaded while the current one is used. Default:
    the delta rule's measured choice for its sequential kernels (32-wide value blocks, 4 warps, 3
    stages; 16-wide blocks crashed there on Hopper with block pointers, Triton 3.6, and run since
    the port). Few programs (B H cdiv(V, 32) below twice the SM count): 16-wide blocks too; many:
    64-wide blocks, which read the (C, K) tiles half as often."""
    K, V, _, _, BH, sms = shape_class
    programs = BH * cdiv(V, 32)
    configs = [tuning.config(4, 3, BV=32), tuning.config(4, 2, BV=32)]
    if programs < 2 * sms:
        configs += [tuning.config(4, 3, BV=16), tuning.config(2, 3, BV=16)]
    if programs >= sms and V >= 64:
        configs += [tuning.config(4, 3, BV=64)]
    return configs


@tuning.per_class
def _prep_configs(shape_class: tuple) -> list:
    # untuned, one configuration: 8 warps at K = 128 so that the (C, K) float32 tiles of the
    # column loop stay in registers, else 4; Triton's default 3 stages. Not on a tuning list:
    # its unrolled column loops take the longest of all our kernels to compile
    return [tuning.config(8 if shape_class[0] > 64 else 4, 3)]


@tuning.per_class
def _output_configs(shape_class: tuple) -> list:
    # `_output_kernel`, one program per value block, chunk and head. Default (untuned): the prep's
    # warps, 32-wide value blocks; 64-wide ones read r, w and the pair matrices half as often
    warps = 8 if shape_class[0] > 64 else 4
    configs = [tuning.config(warps, 3, BV=32), tuning.config(12 - warps, 3, BV=32)]
    return configs + ([tuning.config(4, 3, BV=64), tuning.config(8, 3, BV=64)] if shape_class[1] >= 64 else [])


def _bwd_grad_launch_options(K: int) -> dict:
    # the gradient kernel holds about twenty (C, K) float32 tiles through its column loop.
    # Untuned: 8 warps; ptxas (sm_90) then reports 150-200 bytes of spills at K = 128 in bf16
    # and at K = 32 with float32-level tiles. Not tuned per class: it is launched once per
    # in-chunk path, each launch skipping the other path's chunks, so a timing of one launch
    # says little about the pair
    return {"num_warps": 8}


# each kernel's argument names, read once at import: read at every launch, `JITFunction.arg_names`
# broke torch.compile's graph once per layer (dynamo: "Unsupported hasattr call"; H100, torch 2.11)
_ARG_NAMES = {kernel.__name__: tuple(kernel.arg_names) for kernel in (
    _bwd_state_kernel, _fwd_state_kernel, _output_kernel, _prep_fwd_kernel)}


def _args(kernel: str, *values) -> dict:
    """The arguments of the kernel named `kernel` by name, up to the tuned ones (BV, warps,
    stages), which `tuning.launch` adds."""
    return dict(zip(_ARG_NAMES[kernel], values))


def _rwkv7_fwd(r, w, k, v, a, b, initial_state, output_final_state):
    B, T, H, K = r.shape
    V = v.shape[-1]
    C, BK = CHUNK, block_size(K)
    NT = cdiv(T, C)
    dev, f32 = r.device, torch.float32
    precision = dot_precision(r.dtype, K)
    inverse_precision = "tf32" if precision == "bf16" else precision
    cls = _shape_class(B, T, H, K, V, precision, dev)
    mid = intermediate_dtype(precision)
    x, s = nan_buffer((B, T, H, V), mid, dev), nan_buffer((B, T, H, V), mid, dev)
    y, bbar, kbar, ybar, rt, at = (nan_buffer((B, T, H, K), mid, dev) for _ in range(6))
    gam = nan_buffer((B * H, NT, K), f32, dev)
    arl, arb, ark, aak = (nan_buffer((B * H, NT, C, C), mid, dev) for _ in range(4))
    tuning.launch("rwkv7.prep", _prep_fwd_kernel, lambda m: (NT, B * H), _prep_configs(cls), cls,
                  {**_args("_prep_fwd_kernel", r, w, k, v, a, b, x, y, bbar, kbar, ybar, rt, at, gam, arl,
                           arb, ark, aak, T, H, K, V, C, BK, block_size(V), precision,
                           inverse_precision, FAST_SPAN)})
    h = nan_buffer((B * H, NT, K, V), mid, dev)
    o = nan_buffer((B, T, H, V), v.dtype, dev)
    ht = nan_buffer((B, H, K, V), f32, dev) if output_final_state else None
    tuning.launch("rwkv7.fwd_state", _fwd_state_kernel, lambda m: (cdiv(V, m["BV"]), B * H),
                  _sequential_configs(cls), cls,
                  {**_args("_fwd_state_kernel", gam, v, x, y, bbar, kbar, h, s, initial_state, ht, T, H,
                           K, V, C, BK), "USE_H0": initial_state is not None,
                   "STORE_HT": output_final_state, "PRECISION": precision})
    tuning.launch("rwkv7.output", _output_kernel, lambda m: (cdiv(V, m["BV"]), NT, B * H),
                  _output_configs(cls), cls,
                  {**_args("_output_kernel", r, w, v, h, s, arb, ark, o, T, H, K, V, C, BK),
                   "PRECISION": precision})
    return o, ht, (h, s, ybar, rt, at, gam, arl, ark, aak)


def _rwkv7_bwd(r, w, k, v, a, b, initial_state, saved, do, dht):
    h, s, ybar, rt, at, gam, arl, ark, aak = saved
    B, T, H, K = r.shape
    V = v.shape[-1]
    C, BK = CHUNK, block_size(K)
    NT = cdiv(T, C)
    dev, f32 = r.device, torch.float32
    precision = dot_precision(r.dtype, K)
    cls = _shape_class(B, T, H, K, V, precision, dev)
    # the in-chunk pair sums of the fast path: tf32 also when the tiles are bf16 (as L^-1)
    pair_precision = "tf32" if precision == "bf16" else precision
    mid = intermediate_dtype(precision)
    dh, p = nan_buffer((B * H, NT, K, V), mid, dev), nan_buffer((B, T, H, V), mid, dev)
    dh0 = nan_buffer((B, H, K, V), f32, dev) if initial_state is not None else None
    tuning.launch("rwkv7.bwd_state", _bwd_state_kernel, lambda m: (cdiv(V, m["BV"]), B * H),
                  _sequential_configs(cls), cls,
                  {**_args("_bwd_state_kernel", rt, at, gam, ybar, do, arl, dh, p, dht, dh0, T, H, K, V,
                           C, BK), "USE_DHT": dht is not None, "STORE_DH0": dh0 is not None,
                   "PRECISION": precision})
    dr, dk, da, db = (nan_buffer(x.shape, x.dtype, dev) for x in (r, k, a, b))
    dv = nan_buffer(v.shape, v.dtype, dev)
    dw = nan_buffer(w.shape, w.dtype, dev)
    for exact in (False, True):
        _bwd_grad_kernel[(NT, B * H)](
            r, w, k, v, a, b, h, s, dh, p, do, ark, aak, dr, dw, dk, dv, da, db,
            T, H, K, V, C, BK, 32, precision, pair_precision, FAST_SPAN, exact,
            **_bwd_grad_launch_options(K))
    return dr, dw, dk, dv, da, db, dh0


class ChunkRWKV7Function(torch.autograd.Function):

    @staticmethod
    def forward(ctx, r, w, k, v, a, b, initial_state, output_final_state):
        o, ht, saved = _rwkv7_fwd(r, w, k, v, a, b, initial_state, output_final_state)
        ctx.save_for_backward(r, w, k, v, a, b, initial_state, *saved)
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        r, w, k, v, a, b, initial_state, *saved = ctx.saved_tensors
        grads = _rwkv7_bwd(r, w, k, v, a, b, initial_state, saved, do.contiguous(),
                           None if dht is None else dht.contiguous())
        return (*grads, None)


def triton_chunk_rwkv7(
    r: torch.Tensor,
    w: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RWKV-7 time mixing in Triton, chunked (CHUNK tokens per chunk, chunks in parallel but for
    two light sequential kernels); differentiable in r, w, k, v, a, b and initial_state.

    Per token: S = S * exp(w)[:, None] + b (a^T S) + k v^T with a^T S read before the decay;
    o = S^T r. Same function as `ltm.ops.rwkv7.naive.naive_rwkv7`, which it is tested against.

    Args:
        r, w, k, a, b: [B, T, H, K]; v: [B, T, H, V]; all float32, bfloat16 or float16 (one dtype),
            K, V <= 128, any T >= 1. w is the log decay (<= 0), any strength: in-chunk decays are
            taken as exp of sums of w, never of their negatives.
        initial_state: [B, H, K, V] (any float dtype, used in float32) or None for zeros.
    Returns:
        o: [B, T, H, V] in the dtype of v; the final state [B, H, K, V] in float32 when
        `output_final_state`, else None. The running state is float32; bfloat16 inputs with
        K >= 64 are multiplied in bfloat16 tiles with float32 sums, and the per-chunk states and
        other intermediates saved for the output and the backward are then bfloat16
        (`ltm.kernels.common.dot_precision`).
    """
    check_rwkv7_inputs(r, w, k, v, a, b, initial_state)
    h0 = None if initial_state is None else initial_state.float().contiguous()
    return ChunkRWKV7Function.apply(*(x.contiguous() for x in (r, w, k, v, a, b)), h0,
                                    output_final_state)
