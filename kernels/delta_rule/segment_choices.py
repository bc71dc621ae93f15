"""The segment choices of the chunked (gated) delta rule's sequential state passes
(`state_passes.py` launches them): whether and how a pass, forward or backward, splits over
segments of chunks run in parallel, by exact segments (transitions and a combine) or, in gated
calls, by decay warm-ups (each segment warms the state entering it up alone), and the warm-up
launches' value blocks, warps and stages; with them the overlapped launch's rule (one segment
only). This module reads `launch_choices.py` (shape classes, the one-segment pass's launches),
which does not read it.
"""
from __future__ import annotations

from ltm.kernels import tuning
from ltm.kernels.common import cdiv
from ltm.kernels.delta_rule.launch_choices import (OVERLAP_PROGRAMS, OVERLAPPED_OUTPUT,
                                                   _programs, _programs_32, _sequential_configs)


# Segments: where B H cdiv(V, 32) programs leave most SMs idle (a few long sequences of few heads),
# the state pass can run per segment of chunks in parallel: (1) each segment from a zero state,
# keeping its end state E_s, and from the identity with U = 0 (V = K), keeping its transition
# P_s, the (K, K) matrix that carries a state through it: S -> exp(G_last) S - (exp(G_last - G)
# K)^T W S per chunk; (2) S_{s+1} = P_s S_s + E_s, sequential over the segments
# (`_segment_states_kernel`); (3) each segment again from its true entering state S_s, storing
# the per-chunk states and D as the one-segment pass does. About 3x the state pass's FLOPs, on up
# to NT / MIN_SEGMENT_CHUNKS times the programs. Off: timed on an H200 (Triton 3.6, bf16, CUDA-graph
# GPU time, gpu/host_overhead.py --segments 0 4 --segment-fill 2 4 8) it was slower at 4 of the 5
# few-B H shapes, forward 0.334 -> 0.444-0.504 ms at 2,8192,8,128, 1.299 -> 1.447-1.572 at
# 2,32768,8,128, 0.172 -> 0.268-0.414 at 1,8192,4,128, 0.678 -> 0.664-1.106 at 1,32768,4,128; only
# 1,16384,8,64 gained (0.311 -> 0.241), and there do_bench lost to the host's time (0.321 ->
# 0.513): the 3x work costs more than the programs gain. tests/kernels/test_kernels_delta_rule.py
# checks it.
SEGMENTED_FORWARD = False
# the backward's state pass by segments likewise (`chunk._bwd_states`: two segment-parallel
# passes, the transition's transpose and a reverse combine, ~3x the sequential work): off, not yet
# timed on a GPU (2026-11-27)
SEGMENTED_BACKWARD = False
MIN_SEGMENT_CHUNKS = 8
# segments bring the programs to about SEGMENT_FILL times the SM count (more segments, more of the
# 3x work; gpu/host_overhead.py --segment-fill sweeps it)
SEGMENT_FILL = 2


# Warm-ups (gated calls, forward and backward): segments as above, but each finds the state entering
# it alone, from zeros at the latest earlier chunk from which the chunks' decays multiply to at most
# exp(WARMUP_LOG_FLOOR) (`chunk_fwd._warmed_state`): one pass, no transitions, no combine, and per
# segment only the few chunks the decay needs (a chunk of 64 tokens at a log decay of -0.5 a token
# is one), or the whole prefix from the initial state (exact) where it never decays that far. Each
# chunk's map of the entering state has norm at most exp(G_last) when beta |k|^2 is in [0, 2] (unit
# keys, beta in [0, 1], as the layers feed it), so the entering state is off by at most exp(floor)
# of the state's size where the warm-up starts: below the tiles' rounding (FlashQLA's forward splits
# long sequences the same way, at a log decay of -10). The backward's segments warm the gradient at
# their end up from the chunks after them alike. The floor per tile precision: bf16 and tf32 tiles
# round to 4e-3 and 5e-4, float32 ones to 6e-8 (exp(-17)). A head where some segment's own decay
# stays above the floor (a warm-up could then run past a segment, up to the whole prefix) runs its
# pass exact in one program while that head's other segments idle (`common.segments_decay_below`):
# such heads cost what the one-segment pass does, not more (H100, 2026-12-07, 1,32768,8,128 at
# 1e-4 of the usual decays: the whole-prefix warm-ups took 1.39 ms forward against 0.81 exact).
WARMUP_FORWARD = True
# the backward's state pass likewise: each segment warms the gradient at its end up from zeros a
# few chunks later (`chunk_bwd._warmed_gradient`; the adjoint maps are the transposes)
WARMUP_BACKWARD = True
MIN_WARMUP_CHUNKS = 4
WARMUP_FILL = 2
WARMUP_LOG_FLOOR = {"bf16": -10.0, "tf32": -10.0, "tf32x3": -17.0, "ieee": -17.0}


# the warm-ups' launches with 64-wide value blocks first (bf16 tiles, V >= 64), their segments
# counted in those programs: the segments give the parallelism a narrow block gave, and each
# program loads a chunk's (BT, K) key and W tiles once for twice the columns. OFF: on an H100
# (9bc9dca, 2026-12-07, records/lab/warmup-sweep-h100-2026-12-07-9bc9dca.json) it took 1,32768,8,128
# from 0.584 / 1.910 ms (forward / forward+backward, narrow) to 0.460 / 1.617, but where the heads
# never decay that far (the same shape at 1e-4 of the decays) the exact one-program heads ran on
# 64-wide blocks, a quarter of the programs: 1.278 / 4.191 against 0.864 / 2.655 narrow and
# 0.800 / 2.518 without warm-ups. The width is chosen at launch, the exact fallback per head inside:
# so with WARMUP_SPLIT_HEADS (below) the exact heads go to a launch of their own on narrow blocks.
# On again with that split (H100, c0dd6cf, records/lab/warmup-sweep-h100-2026-12-07-c0dd6cf.json,
# CUDA-graph ms): 0.451 / 1.595 at 1,32768,8,128, and 0.864 / 2.593 there at 1e-4 of the decays,
# as narrow; 0.238 / 0.822 at 2,8192,8,128 (narrow 0.250 / 0.826)
WARMUP_WIDE = True
# but the forward's warm-ups take the wide block only where the one-segment pass's own (narrow)
# programs leave SMs idle: where they fill them, the wide block's fewer programs split in two
# segments cost the forward 5-9% at 3,5000,12,128, 4,4096,16,128 and 8,2048,8,128 (0.411, 0.410,
# 0.210 ms against 0.391, 0.375, 0.192 narrow, which does not split there), while the backward's
# gained 1-3% (same sweep). True: the forward's as the backward's. As a rule (H200, 396aa16,
# records/lab/warmup-sweep-h200-2026-12-07-396aa16.json, forced warm-ups, CUDA-graph ms): the
# inference forward at narrow's times there (0.382, 0.359, 0.187 against 0.397, 0.393, 0.202 wide);
# forward+backward at narrow's too (1.321, 1.480, 0.758), where wide took 1.259, 1.438, 0.742
WARMUP_WIDE_FORWARD_ALWAYS = False
# by default, warm-ups (both passes) only where the one-segment pass's own programs leave SMs idle:
# where they fill them the warm-ups bought little or no GPU time and their launches cost the host
# (H200, 396aa16, same sweep, exact against warm-ups: CUDA-graph forward+backward 1.31 / 1.321 at
# 3,5000,12,128, 1.49 / 1.48 at 4,4096,16,128, 0.757 / 0.758 at 8,2048,8,128; by do_bench, host
# time included, 1.325 / 1.673 and 1.060 / 1.351 at the first and last). True: by WARMUP_FILL
# wherever the segments come to two or more (a call's `warmup=True` asks that too)
WARMUP_WHERE_FILLED = False


# where the warm-ups' first block is wider than the one-segment pass's, the heads that never decay
# to the floor run exact in a launch of their own on the one-segment pass's blocks (the kernels'
# WARMUP 3), the warm-up launch taking the others only (WARMUP 2): one launch more a pass, whose
# programs read their head's decays and stop where the other launch has the head
WARMUP_SPLIT_HEADS = True


def _warmup_splits_heads(shape_class: tuple, backward: bool = False) -> bool:
    """Whether a forward's (`backward`: backward's) warm-up pass of `shape_class` runs its exact
    heads in a launch of their own."""
    return WARMUP_SPLIT_HEADS and (_warmup_configs(shape_class, backward)[0].kwargs["BV"]
                                   > _sequential_configs(shape_class)[0].kwargs["BV"])


def _warmup_configs(shape_class: tuple, backward: bool = False) -> tuple:
    """`_fwd_kernel`'s (`backward`: `_bwd_state_kernel`'s) launches by warm-ups:
    `_sequential_configs`, with 4 warps, 3 stages and 64-wide value blocks first where WARMUP_WIDE
    and the tiles are bf16 and V >= 64 (a launch `_sequential_configs` lists where programs are
    many); the forward's only where the one-segment pass's programs are fewer than the SMs."""
    filled = _one_segment_programs(shape_class) >= shape_class[-1]
    wide = WARMUP_WIDE and (backward or WARMUP_WIDE_FORWARD_ALWAYS or not filled)
    return _warmup_config_list(shape_class, wide)


def _one_segment_programs(shape_class: tuple) -> int:
    # programs of the one-segment state pass, on its first launch's value blocks
    return _programs(shape_class, _sequential_configs(shape_class)[0].kwargs["BV"])


@tuning.per_class  # (built once per class and switch: this runs twice a call, on the host)
def _warmup_config_list(shape_class: tuple, wide: bool) -> list:
    configs = list(_sequential_configs(shape_class))
    V, precision = shape_class[1], shape_class[2]
    if wide and precision == "bf16" and V >= 64:
        first = tuning.config(4, 3, BV=64)
        configs = [first] + [c for c in configs if str(c) != str(first)]
    return configs


def _warmup_chunks(shape_class: tuple, NT: int, on: bool | None = None,
                   min_chunks: int | None = None, fill: int | None = None,
                   backward: bool = False) -> int:
    """Chunks per segment of a gated forward's (`backward`: backward's) state pass by warm-ups;
    NT (one segment) unless WARMUP_FORWARD (WARMUP_BACKWARD; `on`: one call's choice), then as
    many segments as bring the programs (of `_warmup_configs`' first value block) to about
    WARMUP_FILL times the SMs, each at least MIN_WARMUP_CHUNKS long, where that is two or more (one
    call's `segments` give min_chunks, 0: off, and fill). By default only where the one-segment
    pass's programs leave SMs idle (WARMUP_WHERE_FILLED); a call's `on` or the switch lets
    programs as many as the SMs split too: a warm-up costs a few chunks, not the pass again."""
    default = WARMUP_BACKWARD if backward else WARMUP_FORWARD
    min_chunks = MIN_WARMUP_CHUNKS if min_chunks is None else min_chunks
    if not (default if on is None else on) or min_chunks < 1:
        return NT
    if (on is None and not WARMUP_WHERE_FILLED
            and _one_segment_programs(shape_class) >= shape_class[-1]):
        return NT
    fill = WARMUP_FILL if fill is None else fill
    programs = _programs(shape_class, _warmup_configs(shape_class, backward)[0].kwargs["BV"])
    segments = min(fill * shape_class[-1] // programs, NT // min_chunks)
    return NT if segments < 2 else cdiv(NT, segments)


def _segment_chunks(shape_class: tuple, NT: int, min_chunks: int | None = None,
                    fill: int | None = None, backward: bool = False) -> int:
    """Chunks per segment of the forward's (`backward`: the backward's) state pass; NT (one
    segment) unless SEGMENTED_FORWARD (SEGMENTED_BACKWARD)
    and the programs of 32-wide value blocks fill less than the SMs, then as many segments as
    bring them to about SEGMENT_FILL times the SM count, each at least MIN_SEGMENT_CHUNKS long.
    `min_chunks` and `fill` (one call's `segments`, `triton_chunk_delta_rule`) replace the module's
    setting: segments of at least `min_chunks` chunks (0: off) to about `fill` times the SMs."""
    default = SEGMENTED_BACKWARD if backward else SEGMENTED_FORWARD
    segmented = default if min_chunks is None else min_chunks > 0
    min_chunks = MIN_SEGMENT_CHUNKS if min_chunks is None else max(1, min_chunks)
    fill = SEGMENT_FILL if fill is None else fill
    programs, sms = _programs_32(shape_class), shape_class[-1]
    if not segmented or programs >= sms or NT < 2 * min_chunks:
        return NT
    segments = min(cdiv(fill * sms, programs), NT // min_chunks)
    return cdiv(NT, segments)


# The overlapped launch's rule (`launch_choices`, `OVERLAPPED_OUTPUT`): here, beside
# `_segment_chunks` that it reads
def _overlaps_output(shape_class: tuple, NT: int, backward: bool = True,
                     segments: tuple[int, int] | None = None) -> bool:
    """Whether the forward's state pass and outputs run in one launch: where `OVERLAPPED_OUTPUT`
    allows it, programs of 32-wide value blocks within OVERLAP_PROGRAMS (and below the SMs), one
    segment (`segments`: one call's (min_chunks, fill), see `_segment_chunks`), two chunks or
    more."""
    programs = _programs_32(shape_class)
    return (OVERLAPPED_OUTPUT["training" if backward else "inference"] and NT > 1
            and OVERLAP_PROGRAMS[0] <= programs < min(OVERLAP_PROGRAMS[1], shape_class[-1])
            and _segment_chunks(shape_class, NT, *(segments or ())) == NT)
