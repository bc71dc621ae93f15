"""Input checks and small helpers shared by the Triton ops."""
from __future__ import annotations

import torch
import triton

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
