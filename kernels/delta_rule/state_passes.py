"""The sequential state passes of the chunked (gated) delta rule and their launches, forward and
backward, in one sequential kernel or by segments (`segment_choices`, "Segments"; gated calls also
by decay warm-ups, "Warm-ups"), and the forward's state pass overlapped with the outputs;
`chunk.py` runs them between its chunk-parallel kernels and gives the maths. The kernels are in
`chunk_fwd.py` and `chunk_bwd.py`.
"""
from __future__ import annotations

import torch

from ltm.kernels import tuning
from ltm.kernels.common import block_size, cdiv, nan_buffer, poisoning_buffers
from ltm.kernels.delta_rule import launch_choices, segment_choices
from ltm.kernels.delta_rule.chunk_bwd import _bwd_chunk_kernel, _bwd_local_kernel, _bwd_state_kernel
from ltm.kernels.delta_rule.chunk_fwd import (_fwd_kernel, _fwd_overlapped_kernel, _output_kernel,
                                              _segment_states_kernel)
from ltm.kernels.delta_rule.chunk_prep import _prep_fwd_kernel
from ltm.kernels.delta_rule.launch_choices import CHUNK, _sequential_configs


# each kernel's argument names, read once at import: read at every launch, `JITFunction.arg_names`
# broke torch.compile's graph once per layer (dynamo: "Unsupported hasattr call"; H100, torch 2.11)
_ARG_NAMES = {kernel.__name__: tuple(kernel.arg_names) for kernel in (
    _bwd_chunk_kernel, _bwd_local_kernel, _bwd_state_kernel, _output_kernel, _prep_fwd_kernel)}


def _args(kernel: str, *values) -> dict:
    """The arguments of the kernel named `kernel` by name, up to the tuned ones (BV, warps,
    stages), which `tuning.launch` adds."""
    return dict(zip(_ARG_NAMES[kernel], values))


def _fwd_states(k, w, u, gcum, h, d, h0, ht, dims, precision, cls, fused_o=None, segments=None,
                warmup_chunks=None, from_linv=None):
    """The forward's state pass: the state entering each chunk into h, D into d, the final state
    into ht (None: not asked for); in one sequential kernel, or by segments (`segment_choices`,
    "Segments": off by default; `segments`: one call's (min_chunks, fill)), or by segments of
    `warmup_chunks` chunks that each warm their entering state up from zeros (`segment_choices`,
    "Warm-ups": gated calls only). fused_o = (q, o, scale): the outputs into o in the same pass
    (one segment, or warm-ups); h and d may then be None (not stored). from_linv = (v, beta,
    linv): D from L^-1 in the pass, in one segment or by warm-ups (w and u None: not written)."""
    T, H, HQ, K, V = dims
    BT, BK, BH = CHUNK, block_size(K), k.shape[0] * H
    NT = cdiv(T, BT)
    q, o, scale = fused_o if fused_o is not None else (None, None, 1.0)
    common = {"k": k, "w": w, "gcum": gcum, "q": q, "o": o, "scale": scale, "T": T, "H": H,
              "HQ": HQ, "K": K, "BT": BT, "BK": BK, "PRECISION": precision, "WARMUP": False,
              "LOG_FLOOR": 0., "v": None, "beta": None, "linv": None, "FROM_LINV": False}
    if warmup_chunks is not None and warmup_chunks < NT:
        name, configs = (
            ("delta_rule.fwd_warmup_output", launch_choices._fused_output_configs(cls))
            if fused_o is not None
            else ("delta_rule.fwd_warmup", segment_choices._warmup_configs(cls)))
        # (split: the exact heads in a launch of their own, on the one-segment pass's blocks)
        split = fused_o is None and segment_choices._warmup_splits_heads(cls)
        warmup = {**common, "u": u, "h": h, "d": d, "h0": h0, "ht": ht, "SEG": warmup_chunks,
                  "V": V, "USE_H0": h0 is not None, "STORE_HT": ht is not None,
                  "STORE_HD": h is not None, "SEGMENTED": True, "TRANSITION": False,
                  "FUSE_O": fused_o is not None, "WARMUP": 2 if split else True,
                  "LOG_FLOOR": segment_choices.WARMUP_LOG_FLOOR[precision]}
        if from_linv is not None:
            warmup.update(zip(("v", "beta", "linv"), from_linv), FROM_LINV=True)
        tuning.launch(name, _fwd_kernel, lambda m: (cdiv(V, m["BV"]), BH, cdiv(NT, warmup_chunks)),
                      configs, cls, warmup)
        if split:
            tuning.launch("delta_rule.fwd_warmup_exact", _fwd_kernel,
                          lambda m: (cdiv(V, m["BV"]), BH, 1), _sequential_configs(cls), cls,
                          {**warmup, "WARMUP": 3})
        return
    seg = (NT if fused_o is not None
           else segment_choices._segment_chunks(cls, NT) if segments is None
           else segment_choices._segment_chunks(cls, NT, *segments))
    NS = cdiv(NT, seg)
    common["SEG"] = seg
    pass_kwargs = {"u": u, "h": h, "d": d, "V": V, "STORE_HD": h is not None, "SEGMENTED": NS > 1,
                   "TRANSITION": False, "FUSE_O": fused_o is not None}
    if from_linv is not None:  # (one segment: `chunk._from_linv` asks for it only then)
        pass_kwargs.update(zip(("v", "beta", "linv"), from_linv), FROM_LINV=True)
    if NS > 1:
        f32, dev = torch.float32, k.device
        ends, trans = nan_buffer((BH * NS, K, V), f32, dev), nan_buffer((BH * NS, K, K), f32, dev)
        starts = nan_buffer((BH * NS, K, V), f32, dev)
        for width, extra in ((V, {"u": u, "ht": ends, "TRANSITION": False}),
                             (K, {"u": None, "ht": trans, "TRANSITION": True})):
            tuning.launch("delta_rule.fwd_segment", _fwd_kernel,
                          lambda m, width=width: (cdiv(width, m["BV"]), BH, NS),
                          _sequential_configs(cls), cls,
                          {**common, "h": None, "d": None, "h0": None, "V": width, "USE_H0": False,
                           "STORE_HT": True, "STORE_HD": False, "SEGMENTED": True, "FUSE_O": False,
                           **extra})
        tuning.launch("delta_rule.fwd_segment_states", _segment_states_kernel,
                      lambda m: (cdiv(V, m["BV"]), BH), [tuning.config(4, 1, BV=32)], cls,
                      {"p": trans, "e": ends, "h0": h0, "hs": starts, "ht": ht, "NS": NS, "K": K,
                       "V": V, "BK": BK, "USE_H0": h0 is not None, "STORE_HT": ht is not None,
                       "PRECISION": "tf32x3", "REVERSE": False})  # float32-level: sums over segments
        h0, ht = starts, None
    name, configs = (("delta_rule.fwd_output", launch_choices._fused_output_configs(cls))
                     if fused_o is not None else ("delta_rule.fwd", _sequential_configs(cls)))
    tuning.launch(name, _fwd_kernel, lambda m: (cdiv(V, m["BV"]), BH, NS), configs, cls,
                  {**common, **pass_kwargs, "h0": h0, "ht": ht, "USE_H0": h0 is not None,
                   "STORE_HT": ht is not None})


def _fwd_overlapped(k, w, u, gcum, h, d, h0, ht, q, o, scale, dims, precision, cls, ready):
    """The state pass and the outputs in one launch (`_fwd_overlapped_kernel`): the output
    programs take each chunk as soon as the states and D of its group of EVERY chunks are stored,
    on the SMs the state pass leaves idle. `ready` (`_overlap_counts`) holds the start tickets and
    the per-group counts, zeroed by the prep."""
    T, H, HQ, K, V = dims
    BT, BH = CHUNK, k.shape[0] * H
    NT = cdiv(T, BT)
    tuning.launch("delta_rule.fwd_overlapped", _fwd_overlapped_kernel,
                  lambda m: (cdiv(V, m["BV"]) * BH + cdiv(V, m["BVO"]) * NT * BH,),
                  launch_choices._overlapped_configs(cls), cls,
                  {"k": k, "w": w, "u": u, "gcum": gcum, "h": h, "d": d, "h0": h0, "ht": ht, "q": q,
                   "o": o, "scale": scale, "ready": ready, "T": T, "H": H, "HQ": HQ, "BH": BH, "K": K,
                   "V": V, "BT": BT, "BK": block_size(K), "USE_H0": h0 is not None,
                   "STORE_HT": ht is not None, "PRECISION": precision},
                  restore=("ready",))


def _overlap_counts(BH: int, NT: int, device: torch.device) -> torch.Tensor:
    """`_fwd_overlapped_kernel`'s counters, the start ticket then at most NT group counts per
    state, for the prep to zero (its ZERO_READY: one launch less than a memset, 2,8192,8,128
    forward 0.2586 against 0.2612 ms of CUDA-graph time, H100). Under LTM_POISON_BUFFERS (the
    tests) they start at -1, so that a count the prep fails to zero shows."""
    if poisoning_buffers():
        return torch.full((1 + BH * NT,), -1, dtype=torch.int32, device=device)
    return torch.empty(1 + BH * NT, dtype=torch.int32, device=device)


def _bwd_states(k, w, gcum, dd, dh_local, dh, dht, dh0, dims, precision, cls, segments=None,
                warmup_chunks=None, dd_out=None):
    """The backward's state pass (it adds to dd and may write dh over dh_local: tuning restores
    them after each timed run): one sequential kernel, or by segments (`segment_choices`,
    "Segments"; `segments`: one call's (min_chunks, fill)): (1) every segment in parallel from a
    zero gradient at its end (its own share at its start) and, from the identity with no dO, its
    transition transposed; (2) `_segment_states_kernel` backwards over the segments for the
    gradient at each segment's end; (3) every segment in parallel from it, storing dD and dh.
    Or by segments of `warmup_chunks` chunks that each warm the gradient at their end up from zeros
    (`segment_choices`, "Warm-ups": gated calls only), in one launch; dD then goes to dd_out, and
    dh must not be dh_local (the warm-ups read the later segments' dd and dh_local)."""
    T, H, HQ, K, V = dims
    BT, BK, BH = CHUNK, block_size(K), k.shape[0] * H
    NT = cdiv(T, BT)
    common = {**_args("_bwd_state_kernel", k, w, gcum, dd, dh_local, dh, dht, dh0, T, H, HQ, K, V,
                      BT, BK),
              "PRECISION": precision, "WARMUP": False, "LOG_FLOOR": 0., "dd_out": dd}
    if warmup_chunks is not None and warmup_chunks < NT:
        assert dd_out is not None and dh is not dh_local, "warm-ups read dd and dh_local as left"
        split = segment_choices._warmup_splits_heads(cls, backward=True)  # (as the forward's)
        warmup = {**common, "USE_DHT": dht is not None, "STORE_DH0": dh0 is not None,
                  "SEG": warmup_chunks, "SEGMENTED": True, "MODE": 0, "WARMUP": 2 if split else True,
                  "LOG_FLOOR": segment_choices.WARMUP_LOG_FLOOR[precision], "dd_out": dd_out}
        tuning.launch("delta_rule.bwd_warmup", _bwd_state_kernel,
                      lambda m: (cdiv(V, m["BV"]), BH, cdiv(NT, warmup_chunks)),
                      segment_choices._warmup_configs(cls, backward=True), cls, warmup)
        if split:
            tuning.launch("delta_rule.bwd_warmup_exact", _bwd_state_kernel,
                          lambda m: (cdiv(V, m["BV"]), BH, 1), _sequential_configs(cls), cls,
                          {**warmup, "WARMUP": 3})
        return
    seg = (segment_choices._segment_chunks(cls, NT, backward=True) if segments is None
           else segment_choices._segment_chunks(cls, NT, *segments))
    NS = cdiv(NT, seg)
    if NS == 1:
        tuning.launch("delta_rule.bwd_state", _bwd_state_kernel, lambda m: (cdiv(V, m["BV"]), BH),
                      _sequential_configs(cls), cls,
                      {**common, "USE_DHT": dht is not None, "STORE_DH0": dh0 is not None,
                       "SEG": 0, "SEGMENTED": False, "MODE": 0},
                      restore=("dd", "dh_local"))
        return
    f32, dev = torch.float32, k.device
    starts, ends = nan_buffer((BH * NS, K, V), f32, dev), nan_buffer((BH * NS, K, V), f32, dev)
    trans = nan_buffer((BH * NS, K, K), f32, dev)
    segmented = {**common, "SEG": seg, "SEGMENTED": True, "USE_DHT": False, "STORE_DH0": True}
    for width, extra in ((V, {"dh0": starts, "MODE": 1}), (K, {"dh0": trans, "MODE": 2, "V": K})):
        tuning.launch("delta_rule.bwd_segment", _bwd_state_kernel,
                      lambda m, width=width: (cdiv(width, m["BV"]), BH, NS),
                      _sequential_configs(cls), cls, {**segmented, **extra})
    tuning.launch("delta_rule.bwd_segment_states", _segment_states_kernel,
                  lambda m: (cdiv(V, m["BV"]), BH), [tuning.config(4, 1, BV=32)], cls,
                  {"p": trans, "e": starts, "h0": dht, "hs": ends, "ht": dh0, "NS": NS, "K": K,
                   "V": V, "BK": BK, "USE_H0": dht is not None, "STORE_HT": dh0 is not None,
                   "PRECISION": "tf32x3", "REVERSE": True})  # float32-level, as the forward's
    tuning.launch("delta_rule.bwd_state_segmented", _bwd_state_kernel,
                  lambda m: (cdiv(V, m["BV"]), BH, NS), _sequential_configs(cls), cls,
                  {**segmented, "dht": ends, "USE_DHT": True, "STORE_DH0": False, "MODE": 0},
                  restore=("dd", "dh_local"))
