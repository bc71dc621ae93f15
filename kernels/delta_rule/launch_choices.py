"""Launch choices of the chunked (gated) delta rule's kernels (`chunk.py` launches them): the chunk,
the shape classes, and per kernel a short list of launch configurations (value block BV, warps,
stages), measured default first, with the measurements that chose them. The state passes' segments
and warm-ups, and the warm-up launches' lists, are in `segment_choices.py`, which reads this module.
On a GPU `ltm.kernels.tuning` times a list once per class and keeps the fastest when asked
(LTM_AUTOTUNE=1); otherwise, and under Triton's interpreter, the default runs. One module (the
warm-up lists aside), so that gpu/sweep_launch.py and the tests read every list in one place.
"""
from __future__ import annotations

import torch

from ltm.kernels import tuning
from ltm.kernels.common import cdiv

# Tokens per chunk. 64 keeps the in-chunk matrices on the tensor cores and the number of sequential
# steps low; the tail chunk of a sequence whose length is no multiple of it is masked.
CHUNK = 64


# Streaming multiprocessors of the GPU the shape classes below were written for (H100 SXM: 132,
# H200: 132); `_sm_count` asks for the device's own count when there is one.
DEFAULT_SM_COUNT = 132


# GPU index -> its SM count, asked once per GPU: `get_device_properties` took 17 us a call under
# cProfile on the H100 host, twice per delta-rule forward
_SM_COUNTS: dict[int, int] = {}


def _sm_count(device: torch.device | None) -> int:
    if device is None or device.type != "cuda":
        return DEFAULT_SM_COUNT
    if torch.compiler.is_compiling():  # Dynamo traces the call (and would guard on the dict)
        return torch.cuda.get_device_properties(device).multi_processor_count
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNTS:
        _SM_COUNTS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNTS[index]


def _shape_class(B: int, T: int, H: int, K: int, V: int, precision: str,
                 device: torch.device | None) -> tuple:
    """What the launch choices depend on: head sizes, tile precision, chunks per sequence (the
    sequential kernels' steps) and B H (their programs per value block), the last two rounded up
    to powers of two, and the SM count. One tuning per class and dtype (`ltm.kernels.tuning`)."""
    return (K, V, precision, tuning.bucket(cdiv(T, CHUNK), 1024), tuning.bucket(B * H, 1024),
            _sm_count(device))


def _programs(shape_class: tuple, block: int) -> int:
    # programs of a sequential kernel on value blocks `block` wide in this class: B H times them
    K, V, _, _, BH, _ = shape_class
    return BH * cdiv(V, block)


def _programs_32(shape_class: tuple) -> int:
    return _programs(shape_class, 32)


@tuning.per_class
def _sequential_configs(shape_class: tuple) -> list:
    """`_fwd_kernel` and `_bwd_state_kernel`: they walk the chunks one after another carrying only
    the (BK, BV) state, so the next chunk's tiles can be loaded while the current one is used.
    Default (first): 32-wide value blocks, 3 stages, 4 warps (2.28 against 2.46 ms fwd+bwd at
    8,2048,8,128, 1.70 against 1.75 at 8,2048,16,64; H100, gpu/sweep_launch.py sequential).
    float32 tiles (float32 and float16 inputs) of keys wider than 64 are twice those bytes: with 3
    stages `_bwd_state` asked for 246,784 bytes of shared memory where a Hopper block may have
    232,448 (tests/kernels/test_kernels_shared_memory.py), so 1 stage and 8 warps there.
    Where B H cdiv(V, 32) programs leave SMs idle (below twice the SM count) 16-wide blocks double
    them (no gain measured at 2,8192,8,128, 64 programs: tuned per class rather than imposed);
    below 64 programs (bf16 tiles) they are the default, measured below;
    where there are programs to spare, 64-wide blocks read the (64, K) key tiles half as often."""
    K, V, precision, _, _, sms = shape_class
    programs = _programs_32(shape_class)
    if K > 64 and precision != "bf16":
        # 16-wide blocks with 1 stage left the list: forward outputs 3-5% off in float32 on an H100
        # (Triton 3.6; tests/kernels/test_kernels_delta_rule.py checks every listed launch there)
        return [tuning.config(8, 1, BV=32), tuning.config(4, 1, BV=32)]
    configs = [tuning.config(4, 3, BV=32), tuning.config(4, 2, BV=32)]
    if programs < 2 * sms:
        configs += [tuning.config(4, 3, BV=16)]
        if precision == "bf16" and programs >= 64:  # below 64 they come first (next branch)
            # for the tuner (LTM_AUTOTUNE=1): forward 0.319 against 0.333 ms with 3 stages at
            # 2,8192,8,128 (64 programs of 32 columns; H100, Triton 3.6, `--wide`, 2026-11-25); not
            # the default: 16-wide blocks gained nothing in forward+backward at 64 programs before
            # (`_bwd_state` takes this list too), and at 8,2048,8,128 (256 programs) the forward
            # took 0.330 against 0.280 ms
            configs += [tuning.config(4, 4, BV=16)]
    if programs < 64 and precision == "bf16":
        # few programs (a single long sequence of few heads): 16-wide blocks and 4 stages first.
        # At 1,32768,4,128 (16 programs of 32 columns, 512 steps) the forward took 0.74 against
        # 1.03 ms and the forward+backward with `_bwd_state` on them 3.47 against 3.57 ms; at
        # 1,16384,8,64 0.375 against 0.404 and 1.32 against 1.36 ms (H100, bf16,
        # gpu/sweep_launch.py --wide: 16 or 32 columns x 2 or 4 warps x 2-4 stages)
        configs = [tuning.config(4, 4, BV=16)] + configs
    if programs >= sms and V >= 64:
        configs += [tuning.config(4, 3, BV=64), tuning.config(8, 2, BV=64)]
    return configs


@tuning.per_class
def _parallel_configs(shape_class: tuple) -> list:
    """`_output_kernel` (chunk-parallel, one program per value block, chunk and head). 32-wide
    blocks with 4 warps and 1 stage (0.33 against 0.41 ms with 8 warps at 8,2048,8,128; H100,
    gpu/sweep_launch.py output); wider blocks read q and k fewer times. With bf16 tiles and heads
    wider than 64 the whole head in one 128-wide block comes first: forward 0.545 against 0.606 ms
    at 32,2048,4,128, 0.284 against 0.310 at 8,2048,8,128, 1.37 against 1.53 at 2,32768,8,128
    (stages changed nothing; 8 warps were slower at each width; H100, Triton 3.6, `--wide`)."""
    V, precision = shape_class[1], shape_class[2]
    configs = [tuning.config(4, 1, BV=32), tuning.config(4, 2, BV=32)]
    if V >= 64:
        configs += [tuning.config(4, 1, BV=64), tuning.config(8, 1, BV=64)]
    if V > 64 and precision == "bf16":
        configs = [tuning.config(4, 1, BV=128)] + configs[:1] + configs[2:3]
    return configs


# The prep on PREP_PROGRAMS_PER_SM x SMs programs, each looping over the chunks (`_prep_persistent`),
# with bf16 tiles: Triton then loads the next chunk's beta and decays while this one is worked (2
# stages; the key and value tiles are not pipelined, ptxas on the CPU). CUDA-graph GPU time, ms,
# one program per chunk against 4 looping programs per SM with 2 warps and 2 stages (H100, Triton
# 3.6, bf16, outputs equal bit for bit; records/lab/prep-persistent-h100-2026-11-26-s18-call8.json):
# forward without a backward 0.284 -> 0.266 at 2,8192,8,128, 0.207 -> 0.194 at 8,2048,8,128,
# 0.399 -> 0.367 at 32,2048,4,128, 1.128 -> 1.039 at 2,32768,8,128, 0.200 -> 0.168 at
# 8,2048,16,64; forward+backward 0.976 -> 0.960, 0.841 -> 0.824, 1.635 -> 1.595, 3.884 -> 3.786,
# 0.672 -> 0.644. 8 per SM was the same (4 fit by registers), 1 stage gained nothing (0.286), 4
# warps lost (0.291). float32 tiles keep one program per chunk: their prep spills tens of KB per
# thread at K = 128 and was not measured looping.
PREP_PROGRAMS_PER_SM = 4


def _prep_persistent(shape_class: tuple) -> bool:
    """Whether the prep runs on looping programs (`PREP_PROGRAMS_PER_SM`): with bf16 tiles."""
    return PREP_PROGRAMS_PER_SM > 0 and shape_class[2] == "bf16"


def _prep_configs(shape_class: tuple) -> list:
    # its products are 16 x 16 blocks, too small to share among 8 warps: 2 warps took the forward
    # from 0.55 to 0.41 ms at 8,2048,8,128 and from 0.46 to 0.25 ms at 8,2048,12,64 (H100,
    # gpu/sweep_launch.py prep). Looping programs (`_prep_persistent`): 2 stages, see above. 255
    # registers per thread leave 4 programs of 2 warps per SM; a register cap (Triton's maxnreg 192
    # / 168 / 128: more programs per SM, 568-1428 bytes of spills per thread at K = 128) did not
    # pay: forward without a backward 0.286 ms uncapped against 0.399 / 0.298 / 0.325 at
    # 2,8192,8,128, 1.109 against 1.126-1.289 at 2,32768,8,128, 0.405 against 0.414-0.481 at
    # 32,2048,4,128; 168 gained only at 8,2048,8,128 (0.224 against 0.243) and 8,2048,16,64 (0.191
    # against 0.209), where the training forward lost (H100, Triton 3.6, gpu/sweep_launch.py --wide
    # --only delta_rule.prep, 2026-11-26)
    # keyed on the persistence as well as the class: the tests patch PREP_PROGRAMS_PER_SM
    return _prep_configs_of(shape_class, _prep_persistent(shape_class))


@tuning.per_class
def _prep_configs_of(shape_class: tuple, persistent: bool) -> list:
    if persistent:
        return [tuning.config(2, 2), tuning.config(2, 1), tuning.config(4, 2)]
    return [tuning.config(2, 1 if shape_class[0] > 64 else 2), tuning.config(4, 1 if shape_class[0] > 64 else 2)]


# Where one value block covers the whole head (V <= 32 with 32-wide blocks), the loop kernels' 8-warp
# launches went wrong on an H100 (Triton 3.6, bf16): `_bwd_local` gave dq with a relative error of
# 0.97 at K = 128, V = 16 and 0.69 at K = 128, V = 32, and an illegal memory access at K = 64, V = 16,
# with 1 or 2 stages; 4-warp launches were right, and so was the interpreter with either (a compiler
# fault, not the maths). Every test that passed with 8 warps looped over two value blocks or more.
SINGLE_BLOCK_MAX_V = 32


@tuning.per_class
def _bwd_local_configs(shape_class: tuple) -> list:
    """`_bwd_local_kernel`: one program per chunk and head, looping over the value columns with a
    (BT, BK) and a (BT, BT) float32 accumulator. 4 warps only (8 were never faster, see
    `SINGLE_BLOCK_MAX_V` for why they are left out). With bf16 tiles and heads wider than 64 the
    whole head in one 128-wide block comes first: forward+backward 2.07 against 2.09 (32 columns,
    3 stages) and 2.22 ms (8 warps, the earlier default) at 32,2048,4,128; 1.07 against 1.09 and
    1.15 at 8,2048,8,128; 4.95 against 5.00 and 5.24 at 2,32768,8,128 (H100, Triton 3.6,
    gpu/sweep_launch.py --wide, the other kernels on their defaults). At K <= 64, V >= 64: all 64
    columns at once (0.89 against 1.07 ms at 8,2048,12,64, measured when one kernel did both)."""
    K, V, precision = shape_class[0], shape_class[1], shape_class[2]
    if K <= 64 and V >= 64:
        return [tuning.config(4, 2, BV=64), tuning.config(4, 1, BV=64), tuning.config(4, 2, BV=32)]
    configs = [tuning.config(4, 2, BV=32), tuning.config(4, 1, BV=32)]
    if V > 64 and precision == "bf16":
        configs = [tuning.config(4, 1, BV=128), tuning.config(4, 3, BV=32)] + configs[:1]
    return configs


@tuning.per_class
def _bwd_chunk_configs(shape_class: tuple) -> list:
    """`_bwd_chunk_kernel`: one program per chunk and head, looping over the value columns with a
    (BT, BK) and a (BT, BT) float32 accumulator. At K <= 64, V >= 64: all 64 columns at once with
    4 warps. At K = 128, 8 warps: 32 columns with 2 stages (2.19 against 2.29 ms at 8,2048,8,128;
    16 warps were slower, 3.5 ms, and crashed at K = 64 with an illegal memory access); with bf16
    tiles and V >= 128, 64 columns with 3 stages come first since dq left this kernel: 2.05
    against 2.14 (32 columns, 3 stages) and 2.22 ms (2 stages) at 32,2048,4,128; 1.07 against 1.11
    and 1.15 at 8,2048,8,128; 4.93 against 5.08 and 5.24 at 2,32768,8,128 (H100, Triton 3.6, `--wide`;
    128 columns were slower, 2.22-2.42 ms; 4 warps on 64 columns 2.38-2.52). With float32 tiles at
    K = 128 two stages of 32 columns take 229,376 of the 232,448 bytes of shared memory.
    Two programs per chunk and head, one per half of K, were slower at every shape measured
    (6.35-6.77 against 6.18 ms forward+backward at 2,32768,8,128, 2.75-3.01 against 2.69 at
    4,4096,16,128, 1.46-1.91 against 1.36 at 8,2048,16,64; H100, gpu/sweep_launch.py): the (BT, BT)
    products over V that both halves need cost more than the narrower accumulators save."""
    K, V, precision = shape_class[0], shape_class[1], shape_class[2]
    if K <= 64 and V >= 64:
        return [tuning.config(4, 2, BV=64), tuning.config(4, 1, BV=64), tuning.config(4, 2, BV=32)]
    if V <= SINGLE_BLOCK_MAX_V:
        return [tuning.config(4, 2, BV=32), tuning.config(4, 1, BV=32)]
    if K > 64 and V >= 128 and precision == "bf16":
        return [tuning.config(8, 3, BV=64), tuning.config(8, 2, BV=64), tuning.config(8, 3, BV=32),
                tuning.config(8, 2, BV=32)]
    return [tuning.config(8 if K > 64 else 4, 2, BV=32), tuning.config(8 if K > 64 else 4, 1, BV=32),
            tuning.config(4 if K > 64 else 8, 2, BV=32)]


# Outputs out of the state pass (`_fwd_kernel` with FUSE_O), per kind of forward: "inference" (no
# backward to follow: the per-chunk states and D are then neither written nor read again) and
# "training" (they are still stored for the backward; only `_output_kernel`'s second read of them,
# of Q and of K goes). The state pass then also does Q K^T and two products per chunk and value
# block on its programs, so it pays only where they are many. Measured on an H200 (Triton 3.6,
# bf16, gpu/sweep_launch.py --wide --only delta_rule.fwd_output and gpu/host_overhead.py
# --fused-output, do_bench ms, each shape's best launch): the forward without a backward 0.215
# against 0.254 at 8,2048,8,128, 0.202 against 0.244 at 8,2048,16,64, 0.405 against 0.488 at
# 32,2048,4,128 (B H cdiv(V, 32) programs >= the SMs); slower where they are few: 0.407 against
# 0.341 at 2,8192,8,128, 1.60 against 1.31 at 2,32768,8,128, 1.36 against 0.68 at 1,32768,4,128.
# In training it was slower (forward+backward, CUDA-graph GPU time 0.815 against 0.786 ms at
# 8,2048,8,128, 1.13 against 1.00 at 2,8192,8,128): off.
FUSED_OUTPUT = {"inference": True, "training": False}


def _fuses_output(shape_class: tuple, backward: bool) -> bool:
    """Whether this forward takes its outputs out of the state pass: where `FUSED_OUTPUT` allows
    it for the kind of forward, with bf16 tiles (the measured case) and programs of 32-wide value
    blocks at least as many as the SMs."""
    precision, sms = shape_class[2], shape_class[-1]
    return (FUSED_OUTPUT["training" if backward else "inference"] and precision == "bf16"
            and _programs_32(shape_class) >= sms)


@tuning.per_class
def _fused_output_configs(shape_class: tuple) -> list:
    """`_fwd_kernel` with the outputs fused (bf16 tiles): 4 warps (8 were 1.2-2x slower: 4 spill
    0.3 KB per thread at K = 128, but 8 split the (BT, BT) Q K^T work worse). K = 128: 32-wide value
    blocks, 2 stages (0.215 against 0.233-0.264 ms for the next launches at 8,2048,8,128; 0.405
    against 0.449 at 32,2048,4,128; 0.119 against 0.123 at 16,512,8,128); K <= 64: 64-wide blocks,
    3 stages, Q K^T once per 64 columns (1.255 against 1.503 for 32-wide at 8,8192,32,64; 0.203
    against 0.202 at 8,2048,16,64). Other tiles: the state pass's own list."""
    K, V, precision, _, _, _ = shape_class
    if precision != "bf16":
        return _sequential_configs(shape_class)
    if K > 64:
        return [tuning.config(4, 2, BV=32), tuning.config(4, 3, BV=64), tuning.config(4, 3, BV=32)]
    if V > 32:
        return [tuning.config(4, 3, BV=64), tuning.config(4, 3, BV=32), tuning.config(4, 2, BV=64)]
    return [tuning.config(4, 3, BV=32), tuning.config(4, 2, BV=32)]


# The state pass and the outputs in one launch (`_fwd_overlapped_kernel`), per kind of forward
# (as `FUSED_OUTPUT`): where the state pass's programs leave SMs idle, the output programs run on
# them while it goes on, each group of chunks once its states and D are stored, instead of after
# the whole pass. Measured on an H200 (Triton 3.6, bf16, gpu/host_overhead.py --overlapped-output
# none both, do_bench ms; outputs equal to the two-launch forward's bit for bit): at 64 programs of
# 32 columns the forward took 0.291 against 0.338 at 2,8192,8,128 and 1.098 against 1.289 at
# 2,32768,8,128, the forward+backward 1.022 against 1.081 and 3.675 against 3.894. It lost
# elsewhere: below 64 programs (forward 0.371 against 0.321 at 1,16384,8,64, 0.701 against 0.684
# at 1,32768,4,128; 0.427 against 0.404 ms of GPU time at 1,16384,16,64), where the state pass is
# all but the whole forward and the waiting programs and the releases cost it more than the
# outputs' time; at 128 (GPU time 0.152 against 0.127 ms forward, 0.427 against 0.402
# forward+backward at 4,2048,8,128) and at 256 (forward+backward 0.839 against 0.777 at
# 8,2048,8,128), where the state pass leaves few SMs idle.
# NEGATIVE, not kept: the prep in the same launch as well (the state pass waiting for groups of
# 16-64 chunks' W, U and G from prep programs of later tickets) took the forward to 0.63-0.64 ms
# of GPU time at 2,8192,8,128 (0.285 without), 2.48 at 2,32768,8,128 (1.09) and 3.6-4.1 at
# 4,2048,8,128 (0.15): the prep's share of one kernel's registers spilled 1.3 KB per thread and
# its programs held the SMs the outputs needed.
# NEGATIVE, not kept: the prep overlapped with the overlapped launch (2026-11-26; commit f7d3397's
# gpu/results/prep-overlap-h100-2026-11-26-s18-call1.diff): the prep in chunk order counting each
# chunk's stores, the overlapped kernel launched as its programmatic dependent (Triton's
# launch_pdl; the prep's programs call gdc_launch_dependents first) and the state pass walking
# its chunks in 1, 2 or 4 parts, each once the prep had stored it. Outputs equal bit for bit, but
# CUDA-graph forward 0.286-0.292 ms against 0.281 at 2,8192,8,128, 1.088-1.107 against 1.111 at
# 2,32768,8,128, 0.150-0.153 against 0.145 at 4,4096,4,128 (H100, Triton 3.6, bf16): the prep
# runs in about 4 waves of programs (255 registers per thread), so the dependent starts only
# with the last wave, and the counts and parts cost the rest (the same without the dependent
# launch: 0.295 at 2,8192,8,128).
# NEGATIVE, not kept: the overlapped launch as the prep's programmatic dependent with nothing but a
# wait for the whole prep at its start (2026-11-26; a40e938's gpu/results/prep-zero-pdl-h100-2026-11-26-s19-
# call2.diff): CUDA-graph forward 0.654 against 0.670 ms at 2,16384,16,64 but 0.260 against 0.259
# at 2,8192,8,128, and do_bench 1.040 against 1.002 at 2,32768,8,128 (H100, Triton 3.6, bf16).
OVERLAPPED_OUTPUT = {"inference": True, "training": True}
OVERLAP_PROGRAMS = (64, 128)
# (the rule that reads them, `_overlaps_output`, is in segment_choices.py, beside the segments
# it reads too)


@tuning.per_class
def _overlapped_configs(shape_class: tuple) -> list:
    """`_fwd_overlapped_kernel`: the state pass's launches (BV, warps, stages) with the output
    kernel's default value block (BVO), a release every EVERY chunks, and LANES = the threads (each
    releases its own stores). EVERY: the release of every thread costs the state pass's step, so
    one per 4 chunks. The forward without a backward, BV 32, 3 stages: 0.287 ms against 0.323
    (every chunk) and 0.297 (every 16) at 2,8192,8,128; 1.095 against 1.235 and 1.113 at
    2,32768,8,128 (H200, gpu/sweep_launch.py --wide; a sleep between the waiting programs' reads
    changed nothing and was left out)."""
    BVO = _parallel_configs(shape_class)[0].kwargs["BV"]
    return [tuning.config(c.num_warps, c.num_stages, BV=c.kwargs["BV"], BVO=BVO, LANES=32 * c.num_warps,
                          EVERY=every)
            for every in (4, 16) for c in _sequential_configs(shape_class)]

