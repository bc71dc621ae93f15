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
    """tl.dot precision for fp32 intermediates: exact fp32 ("ieee") when the inputs are float32,
    so float32 results match a float64 reference to ~1e-6; tf32 for half inputs, whose own
    rounding (~4e-3) dwarfs tf32's (~5e-4)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def block_size(size: int) -> int:
    """Power-of-two tile covering `size`, at least 16 (tl.dot's smallest operand side)."""
    return max(16, triton.next_power_of_2(size))
