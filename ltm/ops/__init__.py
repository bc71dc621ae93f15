"""Sequence-mixing operators: one folder per op, and in it every implementation of that op.

Each op folder has `naive.py` (the token-by-token reference), `chunk.py` (parallel over the
sequence, PyTorch) and `step.py` (one token, PyTorch); its `__init__` exports those and the two
entry points the layers call, a sequence form and a one-token form, which take `kernel=` and pick
the implementation with a plain `if`:

    naive    the token-by-token reference
    torch    the chunked PyTorch form (one token: the PyTorch step)
    triton   our Triton kernels, `ltm.kernels.<op>` (the kernels/ folder)
    fla      flash-linear-attention, when installed (one token: the PyTorch step); its float32
             products are TF32, about 1e-3 off the token loop (H100, fla-core 0.6.0)
    auto     per call, the one of triton and fla measured fastest for the call's shape class on
             this device, among those computing the call's function (`ltm.ops.auto`); torch off
             CUDA

The Triton and fla modules are imported on first use, in one helper per op (`_lazy_path`).
"""
from __future__ import annotations

import importlib.util

# the implementations; "auto" names no implementation of its own but picks one of them per call
KERNELS = ("naive", "torch", "triton", "fla")
KERNEL_CHOICES = KERNELS + ("auto",)


def unknown_kernel(kernel: str) -> ValueError:
    """The one-line error for a kernel name that is none of KERNEL_CHOICES."""
    return ValueError(f"kernel: unknown kernel {kernel!r}, expected one of "
                      f"{', '.join(KERNEL_CHOICES)}")


def check_kernel(kernel: str) -> None:
    """Raise a one-line error unless `kernel` names an implementation that can run here (or
    "auto", which never picks one that cannot)."""
    if kernel not in KERNEL_CHOICES:
        raise unknown_kernel(kernel)
    # the Triton kernels need no check: Triton is a dependency (its interpreter runs them on CPU)
    if kernel == "fla" and importlib.util.find_spec("fla") is None:
        raise ValueError("kernel: 'fla' needs flash-linear-attention (pip install fla-core), "
                         "which is not installed")
