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


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot precision for the float32 tiles the kernels multiply. float32 inputs: "tf32x3"
    (three tf32 products, float32-level error ~1e-6, on the tensor cores; plain "ieee" spills
    heavily at K = 128 and compiles for minutes). Half inputs: "tf32", whose rounding (~5e-4)
    is far below that of the half-precision inputs and outputs (~4e-3). The CPU interpreter
    multiplies in exact float32 either way."""
    return "tf32x3" if dtype == torch.float32 else "tf32"


def block_size(size: int) -> int:
    """Power-of-two tile covering `size`, at least 16 (tl.dot's smallest operand side)."""
    return max(16, triton.next_power_of_2(size))


def nan_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A buffer for a kernel to fill. With LTM_POISON_BUFFERS=1 (the tests set it) it is filled
    with NaN first, so an element a kernel fails to write shows up instead of stale memory;
    otherwise it is left uninitialised: poisoning writes every intermediate once more (about 4%
    of the delta rule's forward+backward time on an H200)."""
    if os.environ.get("LTM_POISON_BUFFERS") == "1":
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
def load_rows(x, i_b, i_h, T, H, D: tl.constexpr, row0, BC: tl.constexpr, BD: tl.constexpr):
    """Rows row0 .. row0 + BC of head i_h of a [B, T, H, D] tensor, as a (BC, BD) float32 tile
    (zeros past T and D)."""
    p = tl.make_block_ptr(x + (i_b * T * H + i_h) * D, (T, D), (H * D, 1), (row0, 0), (BC, BD), (1, 0))
    return tl.load(p, boundary_check=(0, 1)).to(tl.float32)


@triton.jit
def store_rows(x, val, i_b, i_h, T, H, D: tl.constexpr, row0, BC: tl.constexpr, BD: tl.constexpr):
    """Store a (BC, BD) tile into rows row0 .. row0 + BC of head i_h of a [B, T, H, D] tensor."""
    p = tl.make_block_ptr(x + (i_b * T * H + i_h) * D, (T, D), (H * D, 1), (row0, 0), (BC, BD), (1, 0))
    tl.store(p, val, boundary_check=(0, 1))
