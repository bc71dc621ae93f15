"""Chunked (gated) delta rule in Triton: the launchers, the autograd Function and the public op
`triton_chunk_delta_rule`. The kernels are in `chunk_prep.py`, `chunk_fwd.py` and `chunk_bwd.py`;
what each launch chooses (chunk, value blocks, warps, stages) in `launch_choices.py`, the state
passes' segments and warm-ups in `segment_choices.py`: per kernel a short list of launch
configurations per shape class, measured default first; on a GPU `ltm.kernels.tuning` times a list
once per class and keeps the fastest when asked, otherwise the default runs. The variants
gpu/delta_rule_variants.py times (tile precision, the inverse, the backward's buffer dtypes) are
switches here.

Per chunk of BT tokens, with G the in-chunk cumulative log decay and S0 the state entering it:
    A    = strict_lower(beta_i k_i.k_j exp(G_i - G_j)),  L = I + A
    W    = L^-1 (beta exp(G) K),  U = L^-1 (beta V),  D = U - W S0     (D: the applied deltas)
    O    = scale [exp(G) Q S0 + (causal exp(G_i - G_j) Q K^T) D]
    S_BT = exp(G_last) S0 + (exp(G_last - G) K)^T D
Forward kernels: `_prep_fwd_kernel` (chunk_prep.py; chunk-parallel: L^-1, W, U), then in
chunk_fwd.py `_fwd_kernel` (sequential over chunks: states and D), `_output_kernel` (chunk-parallel:
O). A forward that no backward follows (no input needs a gradient, or no_grad) keeps nothing for
one: no L^-1, and where `launch_choices._fuses_output` (many programs, bf16) `_fwd_kernel` writes O
itself, chunk by chunk, so the per-chunk states and D are never stored, and the prep writes L^-1
in place of W and U, from which the pass makes D (FORWARD_FROM_LINV, `_from_linv`). Where
`segment_choices._overlaps_output` (64-127 programs: SMs idle during the state pass),
`_fwd_overlapped_kernel` runs the state pass and the outputs in one launch, each group of chunks'
outputs as soon as its states are stored. Backward kernels
(chunk_bwd.py): `_bwd_local_kernel` (chunk-parallel: the in-chunk parts of dD and of the state
gradients, dq, the in-chunk score gradient dS), `_bwd_state_kernel` (sequential, backwards: the
rest of dD and of the state gradients), `_bwd_chunk_kernel` (chunk-parallel: dk, dv, dbeta, dg).
dq moved from `_bwd_chunk` to `_bwd_local` on 2026-11-25: it needs only the saved D and states, and
`_bwd_chunk`'s registers at K = 128 (bf16 spills 904 -> 332 bytes per thread) paid for the second
read of them (forward+backward 2-14% faster over 8 shapes, GPU time; LOG.md). The sequential passes' launches
(one kernel, or by segments) are in `state_passes.py`. Tested against
`ltm.ops.delta_rule.naive.naive_delta_rule`. Every kernel takes H (the states: beta's, g's and the
outputs' heads) and HQ (the heads of q, k, v; H a multiple of it, see "grouped heads" below).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ltm.kernels import tuning
from ltm.kernels.common import (block_size, cdiv, check_btd, check_dtype, check_head_dim, check_state,
                                dot_precision, intermediate_dtype, nan_buffer)
from ltm.kernels.delta_rule.chunk_bwd import _bwd_chunk_kernel, _bwd_local_kernel
from ltm.kernels.delta_rule.chunk_fwd import _output_kernel
from ltm.kernels.delta_rule.chunk_prep import _prep_fwd_kernel
from ltm.kernels.delta_rule.state_passes import (_args, _bwd_states, _fwd_overlapped, _fwd_states,
                                                 _overlap_counts)
# the launch choices, imported by name: `chunk.CHUNK`, `chunk._bwd_chunk_configs`, ... read as
# before (patch `segment_choices.SEGMENTED_FORWARD` there, where `_segment_chunks` reads it)
from ltm.kernels.delta_rule import launch_choices, segment_choices
from ltm.kernels.delta_rule.launch_choices import (  # noqa: F401
    CHUNK, _bwd_chunk_configs, _bwd_local_configs, _parallel_configs, _prep_configs, _programs_32,
    _sequential_configs, _shape_class, _sm_count)

# Invert L's 16 x 16 diagonal blocks by repeated squaring (tensor cores) rather than forward
# substitution (15 dependent row updates); gpu/delta_rule_variants.py times the two.
INVERSE_BY_SQUARING = True

# A forward without a backward (inference): D made per chunk in the state pass from L^-1, keys,
# values and betas (`chunk_fwd._deltas_from_linv`) in place of W and U written by the prep and
# read back (`_from_linv`). "fused": only where the outputs are fused (the launcher's rule: many
# programs); there it beat W and U at every shape measured (forward, CUDA graph, H100, 634e40c:
# 0.162 / 0.192 ms at 8,2048,8,128, 0.316 / 0.372 at 4,4096,16,128, 0.366 / 0.393 at
# 3,5000,12,128). "always": also in one segment with the output kernel and by warm-ups, faster at
# 2,8192,8,128 (0.203 / 0.237) and 1,32768,8,128 (0.384 / 0.448) but 21% slower there when no head
# decays (1.064 / 0.880): D from L^-1 puts one more product on each chunk's chain (K S0, then
# L^-1 times it, where W and U need only W S0), which a few long chains wait on and many short
# ones do not, and the host cannot see the decays. "never": W and U (LOG.md, 2026-12-07).
FORWARD_FROM_LINV = "fused"


# dtypes of the backward's buffers: dd (dD), dh_local (each chunk's own (exp(G) Q)^T dO, from
# `_bwd_local` to `_bwd_state`) and dh (the chunk-state gradients `_bwd_chunk` reads; the same
# buffer as dh_local when their dtypes agree). "mid": the saved intermediates' dtype (bfloat16
# with bf16 tiles, where `dot` rounds its operands to it anyway), "f32": float32.
# gpu/bwd_buffers_bench.py times the choices: all three "mid" was the fastest of the 8 at each
# of 4 shapes, forward+backward 5.07 against 5.73 ms at 2,32768,8,128, 2.10 against 2.39 at
# 32,2048,4,128, 6.55 against 7.29 at 8,8192,32,64, 1.08 against 1.22 at 8,2048,8,128 (H100,
# Triton 3.6, bf16; gradients within 1.7e-3 of the float32 choice's). `_bwd_state` converts
# its loads to float32 first: adding float32 products to the bfloat16 tiles as loaded had made
# it 2x slower (1.37 -> 2.73 ms at 2,32768,8,128)
BWD_BUFFERS = {"dd": "mid", "dh_local": "mid", "dh": "mid"}


def _bwd_dtype(name: str, mid: torch.dtype, buffers: dict | None = None) -> torch.dtype:
    return mid if (buffers or BWD_BUFFERS)[name] == "mid" else torch.float32


# One call's launch options (`triton_chunk_delta_rule`'s keyword arguments; None: the module's
# choice above or `launch_choices`' rule), handed to the forward and kept for the backward, so
# that a sweep switches a choice for its own calls instead of patching the module.
PRECISIONS = ("bf16", "tf32", "tf32x3", "ieee")
FORCED_CHOICES = ("none", "inference", "both")


class _Options(NamedTuple):
    precision: str | None = None
    inverse_by_squaring: bool | None = None
    fuse_output: str | None = None
    overlap_output: str | None = None
    segments: tuple[int, int] | None = None
    bwd_buffers: dict | None = None
    warmup: bool | None = None


_NO_OPTIONS = _Options()


def _options(precision, inverse_by_squaring, fuse_output, overlap_output, segments,
             bwd_buffers, warmup=None) -> _Options | None:
    """The checked options of one call; None when every one is left to the module (the default
    path, unchanged). Raises a one-line ValueError for a value the launchers do not know."""
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS} or None, got {precision!r}")
    for name, switch in (("inverse_by_squaring", inverse_by_squaring), ("warmup", warmup)):
        if switch is not None and not isinstance(switch, bool):
            raise ValueError(f"{name} must be True, False or None, got {switch!r}")
    for name, choice in (("fuse_output", fuse_output), ("overlap_output", overlap_output)):
        if choice is not None and choice not in FORCED_CHOICES:
            raise ValueError(f"{name} must be one of {FORCED_CHOICES} or None, got {choice!r}")
    if segments is not None:
        if (not isinstance(segments, (tuple, list)) or len(segments) != 2
                or not all(isinstance(n, int) for n in segments) or segments[0] < 0 or segments[1] < 1):
            raise ValueError(f"segments must be (min_chunks >= 0, fill >= 1) or None, got {segments!r}")
        segments = (int(segments[0]), int(segments[1]))
    if bwd_buffers is not None:
        if (not isinstance(bwd_buffers, dict) or not set(bwd_buffers) <= set(BWD_BUFFERS)
                or not set(bwd_buffers.values()) <= {"mid", "f32"}):
            raise ValueError(f"bwd_buffers must map some of {tuple(BWD_BUFFERS)} to 'mid' or 'f32', "
                             f"got {bwd_buffers!r}")
        bwd_buffers = {**BWD_BUFFERS, **bwd_buffers}
    options = _Options(precision, inverse_by_squaring, fuse_output, overlap_output, segments,
                       bwd_buffers, warmup)
    return None if options == _NO_OPTIONS else options


def _forced(choice: str, backward: bool) -> bool:
    """A forced fuse_output / overlap_output choice for a forward with or without a backward."""
    return choice == "both" or (choice == "inference" and not backward)


def _overlaps(cls: tuple, NT: int, backward: bool, opts: _Options) -> bool:
    if opts.overlap_output is not None:
        return NT > 1 and _forced(opts.overlap_output, backward)
    if opts.segments is None:
        return segment_choices._overlaps_output(cls, NT, backward)
    return segment_choices._overlaps_output(cls, NT, backward, segments=opts.segments)


def _delta_rule_fwd(q, k, v, beta, g, scale, initial_state, output_final_state, backward=True,
                    options=None):
    """The forward; g None: no decay; `backward` False: nothing is kept for a backward (no L^-1;
    where `launch_choices._fuses_output`, the outputs come out of the state pass: no per-chunk
    states). `options`: one call's `_Options` (None: the module's choices)."""
    opts = options or _NO_OPTIONS
    B, T, HQ, K = q.shape
    # H states (beta's heads), HQ heads of q, k, v: state head j reads q, k, v head j mod HQ
    H, V = beta.shape[2], v.shape[-1]
    BT, BK = CHUNK, block_size(K)
    NT = cdiv(T, BT)
    dev, f32 = q.device, torch.float32
    precision = dot_precision(q.dtype, K) if opts.precision is None else opts.precision
    inverse_precision = "tf32" if precision == "bf16" else precision
    cls = _shape_class(B, T, H, K, V, precision, dev)
    # W, U, D, the chunk states and L^-1 reach the later kernels only as `dot` operands
    mid = intermediate_dtype(precision)
    fused = (launch_choices._fuses_output(cls, backward) if opts.fuse_output is None
             else _forced(opts.fuse_output, backward))
    # a gated forward by decay warm-ups (`segment_choices`, "Warm-ups"; NT chunks: one segment, not
    # by warm-ups): before the overlapped launch's rule, after a call's forced overlap_output
    warmup_chunks = (NT if g is None else
                     segment_choices._warmup_chunks(cls, NT, opts.warmup, *(opts.segments or ())))
    overlapped = (not fused and _overlaps(cls, NT, backward, opts)
                  and (opts.overlap_output is not None or warmup_chunks == NT))
    from_linv = _from_linv(cls, NT, backward, fused, overlapped, warmup_chunks, opts.segments)
    w, u = ((None, None) if from_linv else
            (nan_buffer((B, T, H, K), mid, dev), nan_buffer((B, T, H, V), mid, dev)))
    gcum = nan_buffer((B, T, H), f32, dev)
    linv = nan_buffer((B * H, NT, BT, BT), mid, dev) if backward or from_linv else None
    o = nan_buffer((B, T, H, V), v.dtype, dev)
    ht = nan_buffer((B, H, K, V), f32, dev) if output_final_state else None
    # the per-chunk states and D: for the output kernel or the backward
    h, d = ((nan_buffer((B * H, NT, K, V), mid, dev), nan_buffer((B, T, H, V), mid, dev))
            if backward or not fused else (None, None))
    ready = _overlap_counts(B * H, NT, dev) if overlapped else None
    # looping programs where `launch_choices._prep_persistent`, else one program per chunk
    persistent = launch_choices._prep_persistent(cls)
    programs = min(NT * B * H, launch_choices.PREP_PROGRAMS_PER_SM * _sm_count(dev))
    tuning.launch("delta_rule.prep", _prep_fwd_kernel,
                  (lambda m: (programs,)) if persistent else (lambda m: (NT, B * H)),
                  _prep_configs(cls), cls,
                  {**_args("_prep_fwd_kernel", k, v, beta, g, w, u, gcum, linv, ready, T, H, HQ, K, V,
                           BT, BK),
                   "BV": block_size(V), "PRECISION": precision, "INV_PRECISION": inverse_precision,
                   "SQUARING": (INVERSE_BY_SQUARING if opts.inverse_by_squaring is None
                                else opts.inverse_by_squaring),
                   "STORE_LINV": backward or from_linv, "STORE_WU": not from_linv,
                   "JOBS": NT * B * H,
                   "PERSISTENT": persistent, "NREADY": ready.numel() if overlapped else 0,
                   "ZERO_READY": overlapped, "USE_G": g is not None})
    if overlapped:
        _fwd_overlapped(k, w, u, gcum, h, d, initial_state, ht, q, o, scale, (T, H, HQ, K, V),
                        precision, cls, ready)
        return o, ht, (w, d, gcum, linv, h)
    _fwd_states(k, w, u, gcum, h, d, initial_state, ht, (T, H, HQ, K, V), precision, cls,
                fused_o=(q, o, scale) if fused else None, segments=opts.segments,
                warmup_chunks=warmup_chunks, from_linv=(v, beta, linv) if from_linv else None)
    if fused:
        return o, ht, (w, d, gcum, linv, h)
    tuning.launch("delta_rule.output", _output_kernel, lambda m: (cdiv(V, m["BV"]), NT, B * H),
                  _parallel_configs(cls), cls,
                  {**_args("_output_kernel", q, k, gcum, h, d, o, scale, T, H, HQ, K, V, BT, BK),
                   "PRECISION": precision})
    # U is not saved: the backward reads D = U - W S0 in its place (chunk_bwd.py)
    return o, ht, (w, d, gcum, linv, h)


def _from_linv(cls: tuple, NT: int, backward: bool, fused: bool, overlapped: bool,
               warmup_chunks: int, segments: tuple | None) -> bool:
    """Whether this forward's state pass makes D from L^-1 (FORWARD_FROM_LINV): never with a
    backward (which reads W); "fused": where the outputs are fused; "always": in any pass that
    can, outputs fused, by warm-ups or in one segment (the overlapped launch and the exact
    segments' launches read W and U)."""
    if FORWARD_FROM_LINV == "never" or backward or overlapped:
        return False
    if FORWARD_FROM_LINV == "fused":
        return fused
    one_segment = segment_choices._segment_chunks(cls, NT, *(segments or ())) == NT
    return fused or warmup_chunks < NT or one_segment


def _delta_rule_bwd(q, k, v, beta, scale, initial_state, saved, do, dht, options=None, gated=False):
    """The backward; `gated`: the forward had g (its state pass may then go by warm-ups)."""
    opts = options or _NO_OPTIONS
    w, d, gcum, linv, h = saved
    B, T, HQ, K = q.shape
    H, V = beta.shape[2], v.shape[-1]
    BT, BK = CHUNK, block_size(K)
    NT = cdiv(T, BT)
    dev, f32 = q.device, torch.float32
    precision = dot_precision(q.dtype, K) if opts.precision is None else opts.precision
    cls = _shape_class(B, T, H, K, V, precision, dev)
    mid = intermediate_dtype(precision)
    buffers = opts.bwd_buffers
    dd = nan_buffer((B, T, H, V), _bwd_dtype("dd", mid, buffers), dev)
    dh_local = nan_buffer((B * H, NT, K, V), _bwd_dtype("dh_local", mid, buffers), dev)
    # a gated state pass by warm-ups (`segment_choices`, "Warm-ups") reads dd and dh_local as
    # `_bwd_local` leaves them: it writes dD and dh elsewhere
    warmup_chunks = (segment_choices._warmup_chunks(cls, NT, opts.warmup, *(opts.segments or ()),
                                                   backward=True) if gated else NT)
    dh = (dh_local if _bwd_dtype("dh", mid, buffers) == dh_local.dtype and warmup_chunks == NT
          else nan_buffer((B * H, NT, K, V), _bwd_dtype("dh", mid, buffers), dev))
    dd_out = dd if warmup_chunks == NT else nan_buffer(dd.shape, dd.dtype, dev)
    dh0 = nan_buffer((B, H, K, V), f32, dev) if initial_state is not None else None
    # grouped heads: each state writes its own share of dq, dk, dv, summed below (float32 shares
    # cost 0.4-0.7 ms more than the sum saves at 8k-16k tokens of 8-16 heads: H100, bf16,
    # gpu/grouped_heads_bench.py; torch's sum accumulates the bf16 shares in float32 and rounds once)
    dq, dk = nan_buffer((B, T, H, K), q.dtype, dev), nan_buffer((B, T, H, K), k.dtype, dev)
    # the in-chunk score gradients (a `dot` operand only) and dG's share of the scores
    ds, dg_local = nan_buffer((B * H, NT, BT, BT), mid, dev), nan_buffer((B, T, H), f32, dev)
    tuning.launch("delta_rule.bwd_local", _bwd_local_kernel, lambda m: (NT, B * H),
                  _bwd_local_configs(cls), cls,
                  {**_args("_bwd_local_kernel", q, k, d, h, gcum, do, dd, dh_local, dq, ds, dg_local,
                           scale, T, H, HQ, K, V, BT, BK), "PRECISION": precision})
    _bwd_states(k, w, gcum, dd, dh_local, dh, dht, dh0, (T, H, HQ, K, V), precision, cls,
                opts.segments, warmup_chunks, dd_out)
    dv = nan_buffer((B, T, H, V), v.dtype, dev)
    dbeta, dg = nan_buffer(beta.shape, beta.dtype, dev), nan_buffer(beta.shape, f32, dev)
    tuning.launch("delta_rule.bwd_chunk", _bwd_chunk_kernel, lambda m: (NT, B * H),
                  _bwd_chunk_configs(cls), cls,
                  {**_args("_bwd_chunk_kernel", q, k, v, beta, d, dd_out, gcum, linv, h, dh, ds,
                           dg_local, dk, dv, dbeta, dg, scale, T, H, HQ, K, V, BT, BK),
                   "PRECISION": precision})
    if H == 2 * HQ:  # an elementwise add: torch's strided sum over the group ran at ~40% of DRAM
        dq, dk, dv = (x[:, :, :HQ] + x[:, :, HQ:] for x in (dq, dk, dv))
    elif H != HQ:
        dq, dk, dv = (x.unflatten(2, (H // HQ, HQ)).sum(2) for x in (dq, dk, dv))
    return dq, dk, dv, dbeta, dg, dh0


class ChunkDeltaRuleFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, beta, g, scale, initial_state, output_final_state, options=None):
        o, ht, saved = _delta_rule_fwd(q, k, v, beta, g, scale, initial_state, output_final_state,
                                       options=options)
        ctx.save_for_backward(q, k, v, beta, initial_state, *saved)
        ctx.scale, ctx.g_dtype, ctx.options = scale, None if g is None else g.dtype, options
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, beta, initial_state, *saved = ctx.saved_tensors
        dq, dk, dv, dbeta, dg, dh0 = _delta_rule_bwd(
            q, k, v, beta, ctx.scale, initial_state, saved, do.contiguous(),
            None if dht is None else dht.contiguous(), options=ctx.options,
            gated=ctx.g_dtype is not None)
        dg = None if ctx.g_dtype is None else dg.to(ctx.g_dtype)
        # a gradient per input: one more (None) where the call passed its options
        return (dq, dk, dv, dbeta, dg, None, dh0, None) + ((None,) if ctx.options is not None else ())


def triton_chunk_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    *,
    precision: str | None = None,
    inverse_by_squaring: bool | None = None,
    fuse_output: str | None = None,
    overlap_output: str | None = None,
    segments: tuple[int, int] | None = None,
    bwd_buffers: dict[str, str] | None = None,
    warmup: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(Gated) delta rule, chunked, in Triton; differentiable in q, k, v, beta, g, initial_state.

    Per token: S = S * exp(g); S = S + beta k (v - S^T k)^T; o = S^T (scale q).
    Same function as `ltm.ops.delta_rule.naive.naive_delta_rule`, which it is tested against.

    Grouped heads: beta and g may carry H = G * HQ heads for the HQ heads of q, k, v; state head j
    then reads q, k, v head j mod HQ. That is the delta rule on q, k, v repeated G times along the
    heads (torch.cat([q] * G, 2)), without the copies: the hierarchical DeltaNet's fast and slow
    states (G = 2) share one q, k, v, and the two programs of a head read it one after the other.

    Args:
        q, k: [B, T, HQ, K]; v: [B, T, HQ, V]; all float32, bfloat16 or float16 (one dtype),
            K, V <= 128. Any T >= 1.
        beta: [B, T, H] with H a multiple of HQ (usually H = HQ), the same dtype.
            g: [B, T, H] log decay (<= 0), any float dtype, or None.
        scale: multiplies q, defaults to K ** -0.5.
        initial_state: [B, H, K, V] (any float dtype, used in float32) or None for zeros.
    Returns:
        o: [B, T, H, V] in the dtype of v; the final state [B, H, K, V] in float32 when
        `output_final_state`, else None. The running state is float32; bfloat16 inputs with
        K >= 64 are multiplied in bfloat16 tiles with float32 sums, and the per-chunk states and
        other intermediates saved for the output and the backward are then bfloat16
        (`ltm.kernels.common.dot_precision` gives the measured errors).

    Launch options, for measurements (gpu/delta_rule_variants.py, gpu/bwd_buffers_bench.py,
    gpu/sweep_launch.py, gpu/host_overhead.py); each None, the default, keeps the launcher's own
    choice, and a value it does not know raises ValueError:
        precision: the tiles' `dot` precision, "bf16", "tf32", "tf32x3" or "ieee", forward and
            backward (default `ltm.kernels.common.dot_precision(q.dtype, K)`).
        inverse_by_squaring: L's diagonal blocks inverted by repeated squaring (True) or by
            forward substitution (False) (default `INVERSE_BY_SQUARING`).
        fuse_output: the outputs out of the state pass in "none" of the forwards, those without a
            backward ("inference") or "both", at every shape (default
            `launch_choices._fuses_output`'s rule).
        overlap_output: the state pass and the outputs in one launch, likewise, wherever the
            sequence has two chunks or more (default `segment_choices._overlaps_output`'s rule).
        segments: (min_chunks, fill): the forward's and the backward's state passes by segments
            of at least min_chunks chunks (0: off), as many as bring the programs to about fill
            times the SMs (default `segment_choices.SEGMENTED_FORWARD`, `SEGMENTED_BACKWARD`,
            `MIN_SEGMENT_CHUNKS`, `SEGMENT_FILL`).
        bwd_buffers: the backward's buffer dtypes by name ("dd", "dh_local", "dh"), "mid" (the
            intermediates' dtype) or "f32"; names left out keep `BWD_BUFFERS`'.
        warmup: a gated call's state passes by segments that each warm their entering state
            (the backward's: the gradient at their end) up from zeros a few chunks away, where the
            decay has fallen below exp(`segment_choices.WARMUP_LOG_FLOOR`) (True; `segments` then
            sizes them), or not (False) (default `segment_choices.WARMUP_FORWARD`,
            `WARMUP_BACKWARD`). Within the floor when beta |k|^2 is in [0, 2] (unit keys, beta in
            [0, 1]), exact where the decay stays above it.
    """
    if q.dim() != 4:
        raise ValueError(f"q must be [B, T, H, K], got shape {tuple(q.shape)}")
    B, T, H, K = q.shape
    check_btd("k", k, (B, T, H), "K")
    check_btd("v", v, (B, T, H), "V")
    if k.shape[-1] != K:
        raise ValueError(f"k must be [B, T, H, K] = {tuple(q.shape)} like q, got {tuple(k.shape)}")
    for name, x in (("q", q), ("k", k), ("v", v), ("beta", beta)):
        check_dtype(name, x, q.dtype)
    if beta.dim() != 3 or tuple(beta.shape[:2]) != (B, T) or beta.shape[2] % H or not beta.shape[2]:
        raise ValueError(f"beta must be [B, T, H] = {(B, T, H)} or [B, T, G * {H}] (grouped "
                         f"heads), got {tuple(beta.shape)}")
    HS = beta.shape[2]  # the states: H, or G * H with grouped heads
    if g is not None and tuple(g.shape) != (B, T, HS):
        raise ValueError(f"g must be [B, T, H] = {(B, T, HS)} like beta, or None, got "
                         f"{tuple(g.shape)}")
    check_head_dim("q/k", K)
    check_head_dim("v", v.shape[-1])
    check_state("initial_state", initial_state, (B, HS, K, v.shape[-1]))
    if T == 0:
        raise ValueError("q must hold at least one token (T >= 1)")
    # no options (the default): nothing to check, nothing more on the host per call
    options = (None if precision is None and inverse_by_squaring is None and fuse_output is None
               and overlap_output is None and segments is None and bwd_buffers is None
               and warmup is None
               else _options(precision, inverse_by_squaring, fuse_output, overlap_output, segments,
                             bwd_buffers, warmup))
    scale = K ** -0.5 if scale is None else float(scale)
    g_in = None if g is None else g.contiguous()  # None: no decay (the prep's USE_G off)
    h0 = None if initial_state is None else initial_state.float().contiguous()
    if not (torch.is_grad_enabled() and any(
            x is not None and x.requires_grad for x in (q, k, v, beta, g, initial_state))):
        # no backward will run: a forward that keeps nothing for one (`_delta_rule_fwd`)
        o, ht, _ = _delta_rule_fwd(q.contiguous(), k.contiguous(), v.contiguous(), beta.contiguous(),
                                   g_in, scale, h0, output_final_state, backward=False,
                                   options=options)
        return o, ht
    # the options only when given: the default call is the one torch.compile has always traced
    extra = () if options is None else (options,)
    o, ht = ChunkDeltaRuleFunction.apply(q.contiguous(), k.contiguous(), v.contiguous(),
                                         beta.contiguous(), g_in, scale, h0, output_final_state,
                                         *extra)
    return o, ht
