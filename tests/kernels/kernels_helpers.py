"""Shared pieces of the kernel tests: device choice, fresh seeds, relative error, tolerances."""
from __future__ import annotations

import random

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ON_GPU = DEVICE.type == "cuda"

# Relative-error bounds ||a - b|| / ||b|| against a float64 reference: (outputs, gradients).
# float32 runs with exact fp32 dot products (input_precision="ieee"); half inputs are rounded to
# 8 (bf16) or 11 (fp16) mantissa bits in the outputs and gradients the kernels write.
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (5e-3, 1e-2), torch.float16: (5e-3, 1e-2)}
# the interpreter computes in numpy, which has no bfloat16: half precision runs on the GPU only
DTYPES = (torch.float32, torch.bfloat16, torch.float16) if ON_GPU else (torch.float32,)


def fresh_seed() -> int:
    """A new seed per test run, printed in every failure message so the case can be replayed."""
    return random.SystemRandom().randrange(2**31)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def case_id(B: int, T: int, H: int, K: int, V: int) -> str:
    return f"B{B}-T{T}-H{H}-D{K}" if K == V else f"B{B}-T{T}-H{H}-K{K}-V{V}"
