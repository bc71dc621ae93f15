"""Input checks and small helpers shared by the Triton ops."""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Largest head size one program holds whole (the state block is [K, BV] in registers).
MAX_HEAD_DIM = 128


def check_btd(name: str, x: torch.Tensor, like: tuple[int, ...], dim_name: str) -> None:
    """Raise a one-line ValueError unless x is [B, T, H, D] with B, T, H = `like`."""
    if x.dim() != 4 or tuple(x.shape[:3]) != like:
        raise ValueError(f"{name} must be [B, T, H, {dim_name}] with B, T, H = {like}, "
                         f"got shape {tuple(x.shape)}")


def check_bhd(name: str, x: torch.Tensor, B: int, H: int) -> None:
    """Raise a one-line ValueError unless x is one token's [B, H, D] in a supported dtype (the
    step kernels' inputs)."""
    if x.dim() != 3 or tuple(x.shape[:2]) != (B, H):
        raise ValueError(f"{name} must be [B, H, D] with B, H = {(B, H)}, got shape {tuple(x.shape)}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{name} must be float32, bfloat16 or float16, got {x.dtype}")


def check_dtype(name: str, x: torch.Tensor, dtype: torch.dtype) -> None:
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{name} must be float32, bfloat16 or float16, got {x.dtype}")
    if x.dtype != dtype:
        raise ValueError(f"{name} must have the dtype of the first input ({dtype}), got {x.dtype}")


def check_head_dim(name: str, size: int) -> None:
    if not 1 <= size <= MAX_HEAD_DIM:
        raise ValueError(f"{name} head size must be in [1, {MAX_HEAD_DIM}], got {size}")


def check_state(name: str, state: torch.Tensor | None, shape: tuple[int, ...]) -> None:
    if state is not None and tuple(state.shape) != shape:
        raise ValueError(f"{name} must be [B, H, K, V] = {shape} or None, got {tuple(state.shape)}")


def check_rwkv7_inputs(r, w, k, v, a, b, initial_state) -> None:
    """The RWKV-7 ops' input checks: r, w, k, a, b [B, T, H, K] alike, v [B, T, H, V], one
    supported dtype, head sizes in range, initial_state [B, H, K, V] or None, T >= 1."""
    if r.dim() != 4:
        raise ValueError(f"r must be [B, T, H, K], got shape {tuple(r.shape)}")
    B, T, H, K = r.shape
    for name, x in (("w", w), ("k", k), ("a", a), ("b", b)):
        if x.shape != r.shape:
            raise ValueError(f"{name} must be [B, T, H, K] = {tuple(r.shape)} like r, got {tuple(x.shape)}")
    check_btd("v", v, (B, T, H), "V")
    for name, x in (("r", r), ("w", w), ("k", k), ("v", v), ("a", a), ("b", b)):
        check_dtype(name, x, r.dtype)
    check_head_dim("r/k", K)
    check_head_dim("v", v.shape[-1])
    check_state("initial_state", initial_state, (B, H, K, v.shape[-1]))
    if T == 0:
        raise ValueError("r must hold at least one token (T >= 1)")


# Triton's CPU interpreter (3.7) multiplies bfloat16 tiles as raw bits and converts float32 to
# bfloat16 by truncation; under it `dot` and `rounded` round to nearest even themselves and
# multiply in float32, which gives the numbers the tensor cores give (exact products of bfloat16
# operands, float32 sums), so the CPU tests check the bfloat16 path too; tf32 products likewise
# (`tf32_truncated`).
_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


def dot_precision(dtype: torch.dtype, head_dim: int) -> str:
    """How the kernels multiply their tiles (`dot`'s PRECISION).

    bfloat16 inputs with head_dim >= 64: "bf16", operands rounded to bfloat16 and summed in
    float32, as fla does; on an H100 this made the delta rule's forward+backward 1.4x faster at
    8,2048,8,128 (3.30 -> 2.35 ms) with errors against float64 of 3.7e-3 (o) and <= 4.1e-3
    (gradients), against 2.2e-3 and 2.8e-3 with tf32 tiles (the delta rule's backward buffers in
    bfloat16 since 2026-11-25, `BWD_BUFFERS`: gradients up to 0.4e-3 further off on the CPU).
    Everything else: "tf32x3" (three tf32 products, float32-level error ~1e-6, on the tensor
    cores; plain "ieee" spills heavily at K = 128 and compiles for minutes). Single tf32
    products (~5e-4 rounding) were not enough: a gradient that is a sum with cancellation (dbeta
    at B1-T1-H1-D32) came out 2.6e-2 off, and small heads cost little either way."""
    if dtype == torch.bfloat16 and head_dim >= 64:
        return "bf16"
    return "tf32x3"


def intermediate_dtype(precision: str) -> torch.dtype:
    """dtype of the saved intermediates that the kernels only feed to `dot` (W, U, D, the chunk
    states, L^-1): bfloat16 where `dot` rounds its operands to it anyway, else float32."""
    return torch.bfloat16 if precision == "bf16" else torch.float32


@triton.jit
def rounded(x, dtype: tl.constexpr):
    """x converted to dtype, rounding to nearest even (also under the interpreter)."""
    if _INTERPRETED and dtype.scalar == tl.bfloat16:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True).to(dtype.scalar)
    else:
        return x.to(dtype)


@triton.jit
def tf32_truncated(x):
    """x in float32 with the 13 low mantissa bits cleared: the operand a tf32 product sees (the
    tensor cores read the top 19 bits; rounding to nearest would halve the error, so the
    interpreter's tf32 `dot` is the more pessimistic of the two). The interpreter multiplies
    float32 exactly otherwise, so without this the CPU tests could not see tf32's rounding."""
    bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
    return (bits & 0xFFFFE000).to(tl.float32, bitcast=True)


@triton.jit
def dot(a, b, PRECISION: tl.constexpr):
    """a @ b with float32 sums; PRECISION as `dot_precision` returns."""
    if PRECISION == "bf16" and not _INTERPRETED:
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    elif PRECISION == "bf16":
        return tl.dot(rounded(a, tl.bfloat16).to(tl.float32), rounded(b, tl.bfloat16).to(tl.float32),
                      input_precision="ieee")
    elif PRECISION == "tf32" and _INTERPRETED:
        return tl.dot(tf32_truncated(a), tf32_truncated(b), input_precision="ieee")
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PRECISION)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for the launchers' grids and counts, in plain Python: Triton 3.7's `triton.cdiv`
    and `triton.next_power_of_2` are constexpr functions, whose wrapper on each call made the delta
    rule forward's host time outside its two launches 84 us against 58 (2-core CPU, launches
    stubbed)."""
    return -(-a // b)


def block_size(size: int) -> int:
    """Power-of-two tile covering `size`, at least 16 (tl.dot's smallest operand side)."""
    return max(16, 1 << (int(size) - 1).bit_length())


def poisoning_buffers() -> bool:
    """Whether buffers for kernels to fill start poisoned (LTM_POISON_BUFFERS=1, the tests)."""
    return os.environ.get("LTM_POISON_BUFFERS") == "1"


def nan_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A buffer for a kernel to fill. With LTM_POISON_BUFFERS=1 (the tests set it) it is filled
    with NaN first, so an element a kernel fails to write shows up instead of stale memory;
    otherwise it is left uninitialised: poisoning writes every intermediate once more (about 4%
    of the delta rule's forward+backward time on an H200)."""
    if poisoning_buffers():
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


@triton.jit
def invert_unit_lower(a, BC: tl.constexpr):
    """(I + a)^-1 for a strictly lower-triangular (BC, BC) tile: forward substitution, one row
    at a time, row i = e_i - sum_{j<i} a_ij x_j."""
    idx = tl.arange(0, BC)
    x = tl.where(idx[:, None] == idx[None, :], 1., 0.)
    for i in tl.static_range(1, BC):
        a_i = tl.sum(tl.where(idx[:, None] == i, a, 0.), axis=0)
        row = tl.sum(a_i[:, None] * x, axis=0)
        x = tl.where(idx[:, None] == i, tl.where(idx == i, 1., 0.)[None, :] - row[None, :], x)
    return x


@triton.jit
def invert_unit_lower_by_squaring(a, BC: tl.constexpr, PRECISION: tl.constexpr):
    """(I + a)^-1 for a strictly lower-triangular (16, 16) tile, on the tensor cores: a is
    nilpotent (a^16 = 0), so (I + a)^-1 = (I - a)(I + a^2)(I + a^4)(I + a^8): six products
    instead of fifteen dependent row updates."""
    tl.static_assert(BC == 16, "the product has the factors for 16 x 16 tiles")
    idx = tl.arange(0, BC)
    eye = tl.where(idx[:, None] == idx[None, :], 1., 0.)
    x = eye - a
    power = dot(a, a, PRECISION)
    x = dot(x, eye + power, PRECISION)
    power = dot(power, power, PRECISION)
    x = dot(x, eye + power, PRECISION)
    power = dot(power, power, PRECISION)
    return dot(x, eye + power, PRECISION)


# Tiles are addressed with plain pointer arithmetic and masks, not block pointers: Triton 3.7
# deprecates `tl.make_block_ptr` and 3.9 removes it ("Block pointers have been removed in favor
# of the tensor descriptor API"). Its successor, `tl.make_tensor_descriptor`, runs in the CPU
# interpreter of 3.6, 3.7 and 3.9 alike (a bounds-checked load/store round trip, checked
# 2026-11-23), but on the GPU a device-side descriptor needs a scratch allocator registered on the
# host (`triton.set_allocator`) before the first launch, Hopper's TMA wants 16-byte-aligned
# strides and bases (H D x itemsize; a [B, T, H, D] head offset), and it changes the generated
# code (bulk copies and barriers instead of vectorised loads), which would need its own GPU
# measurements. Pointers plus masks mean the same on every version with no host set-up, and
# they compile to what the block pointers compiled to (Triton rewrote those into pointers and
# masks before code generation): for sm_90 every delta-rule kernel has the same shared memory
# and the same counts of 16-byte loads, stores and cp.async as before the port. The row mask is
# constant along the contiguous axis, and the column mask is dropped when a tile spans the head.


@triton.jit
def tile(x, row_stride, n_rows, N_COLS: tl.constexpr, row0, col0, BR: tl.constexpr,
         BC: tl.constexpr):
    """Pointers and mask of the (BR, BC) tile at (row0, col0) of a row-major matrix with
    n_rows x N_COLS elements, rows `row_stride` elements apart, starting at pointer x."""
    rows = row0 + tl.arange(0, BR)
    cols = col0 + tl.arange(0, BC)
    ptrs = x + rows[:, None] * row_stride + cols[None, :]
    if BC == N_COLS:
        # a tile as wide as the matrix starts at column 0 (its launch has one column block):
        # only the row mask, which tl.load broadcasts over the columns
        mask = (rows < n_rows)[:, None]
    else:
        mask = (rows < n_rows)[:, None] & (cols < N_COLS)[None, :]
    return ptrs, mask


@triton.jit
def seq_tile(x, i_b, i_h, T, H, D: tl.constexpr, row0, col0, BR: tl.constexpr, BD: tl.constexpr):
    """`tile` of rows row0 .. row0 + BR, columns col0 .. col0 + BD of head i_h of the [B, T, H, D]
    tensor x (row-major, contiguous); masked past T and D. The head's offset is taken in int64:
    B T H D passes 2^31 elements at 64k tokens x 32 heads x 1024, and so do the per-chunk state
    buffers sooner."""
    base = x + (i_b * T * H + i_h).to(tl.int64) * D
    return tile(base, H * D, T, D, row0, col0, BR, BD)


@triton.jit
def seq_tile_t(x, i_b, i_h, T, H, D: tl.constexpr, row0, col0, BR: tl.constexpr,
               BD: tl.constexpr):
    """The transpose of `seq_tile`: the (BD, BR) tile of columns col0 .. col0 + BD and rows
    row0 .. row0 + BR, read straight from memory in that orientation, so that a kernel that
    multiplies by K^T gets it without a transpose in registers on its sequential path."""
    base = x + (i_b * T * H + i_h).to(tl.int64) * D
    rows = row0 + tl.arange(0, BR)
    cols = col0 + tl.arange(0, BD)
    ptrs = base + rows[None, :] * (H * D) + cols[:, None]
    if BD == D:
        mask = (rows < T)[None, :]
    else:
        mask = (rows < T)[None, :] & (cols < D)[:, None]
    return ptrs, mask


@triton.jit
def state_tile(x, i_mat, K: tl.constexpr, V: tl.constexpr, col0, BK: tl.constexpr,
               BV: tl.constexpr):
    """`tile` of the (BK, BV) block at columns col0 .. col0 + BV of matrix i_mat of the
    contiguous [..., K, V] tensor x (a state [B, H, K, V] or per-chunk states [B H, NT, K, V])."""
    base = x + i_mat.to(tl.int64) * (K * V)
    return tile(base, V, K, V, 0, col0, BK, BV)


@triton.jit
def load_tile(ptrs_mask):
    """Load a (`tile`, `seq_tile`, `state_tile`) tile, zeros outside its mask, in its dtype."""
    ptrs, mask = ptrs_mask
    return tl.load(ptrs, mask=mask, other=0.)


@triton.jit
def store_tile(ptrs_mask, val):
    """Store val into a tile, rounded to nearest even into the tensor's dtype."""
    ptrs, mask = ptrs_mask
    tl.store(ptrs, rounded(val, ptrs.dtype.element_ty), mask=mask)


@triton.jit
def store_segment_state(x, val, i_bh, i_s, NS, EDGE, WHOLE: tl.constexpr, K: tl.constexpr,
                        V: tl.constexpr, col0, BK: tl.constexpr, BV: tl.constexpr):
    """A state pass's state at a segment's edge: one per segment into x[i_bh NS + i_s], or
    (WHOLE: segments that each warm their own start up) the whole pass's, from segment EDGE only,
    into x[i_bh]."""
    if WHOLE:
        if i_s == EDGE:
            store_tile(state_tile(x, i_bh, K, V, col0, BK, BV), val)
    else:
        store_tile(state_tile(x, i_bh * NS + i_s, K, V, col0, BK, BV), val)


@triton.jit
def segments_decay_below(gcum, i_b, i_h, T, H, SEG, s_lo, s_hi, LOG_FLOOR, BT: tl.constexpr):
    """Whether each segment s_lo .. s_hi - 1 of SEG full chunks of BT tokens decays a state to at
    most exp(LOG_FLOOR): its chunks' last log decays summed (gcum: [B, T, H], cumulative within a
    chunk), 16 segments by 16 chunks a load. True where there is no such segment."""
    worst = tl.max(tl.full([16], float("-inf"), tl.float32), 0)
    for s0 in range(s_lo, s_hi, 16):
        segs = s0 + tl.arange(0, 16)
        total = tl.zeros([16], dtype=tl.float32)
        for c0 in range(0, SEG, 16):
            chunks = c0 + tl.arange(0, 16)
            inside = (segs < s_hi)[:, None] & (chunks < SEG)[None, :]
            rows = (segs[:, None] * SEG + chunks[None, :]) * BT + BT - 1
            total += tl.sum(tl.load(gcum + (i_b * T + rows) * H + i_h, mask=inside, other=0.), 1)
        worst = tl.maximum(worst, tl.max(tl.where(segs < s_hi, total, float("-inf")), 0))
    return worst <= LOG_FLOOR


@triton.jit
def load_rows(x, i_b, i_h, T, H, D: tl.constexpr, row0, BC: tl.constexpr, BD: tl.constexpr):
    """Rows row0 .. row0 + BC of head i_h of a [B, T, H, D] tensor, as a (BC, BD) float32 tile
    (zeros past T and D)."""
    return load_tile(seq_tile(x, i_b, i_h, T, H, D, row0, 0, BC, BD)).to(tl.float32)


@triton.jit
def store_rows(x, val, i_b, i_h, T, H, D: tl.constexpr, row0, BC: tl.constexpr, BD: tl.constexpr):
    """Store a (BC, BD) tile into rows row0 .. row0 + BC of head i_h of a [B, T, H, D] tensor."""
    store_tile(seq_tile(x, i_b, i_h, T, H, D, row0, 0, BC, BD), val)
