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


def assert_matches_reference(op, reference, xs, names, seed, tol_out, tol_grad,
                             grad_bounds: dict[str, float] | None = None):
    """op(*xs[:-1], initial_state=xs[-1]) against `reference` on float64 copies of the same
    inputs: the output (in the inputs' dtype) and the float32 final state, then the gradient of
    every input that is not None for random cotangents of both; each message names the seed.
    `grad_bounds` gives named gradients a bound of their own in place of `tol_grad`."""
    o, ht = op(*xs[:-1], initial_state=xs[-1], output_final_state=True)
    ref = [None if x is None else x.detach().double().requires_grad_() for x in xs]
    o_ref, ht_ref = reference(*ref[:-1], initial_state=ref[-1], output_final_state=True)
    assert o.dtype == xs[0].dtype and ht.dtype == torch.float32
    assert torch.isfinite(o).all() and torch.isfinite(ht).all(), f"seed={seed}: unwritten output"
    assert rel_err(o, o_ref) <= tol_out, f"seed={seed}: o rel err {rel_err(o, o_ref):.2e} > {tol_out}"
    assert rel_err(ht, ht_ref) <= tol_out, f"seed={seed}: final state rel err {rel_err(ht, ht_ref):.2e}"
    gen = torch.Generator().manual_seed(seed + 1)
    do = torch.randn(o.shape, generator=gen).to(o.device)
    dht = torch.randn(ht.shape, generator=gen).to(o.device)
    ((o.float() * do).sum() + (ht * dht).sum()).backward()
    ((o_ref * do.double()).sum() + (ht_ref * dht.double()).sum()).backward()
    for name, x, x_ref in zip(names, xs, ref):
        if x is None:
            continue
        assert x.grad is not None and torch.isfinite(x.grad).all(), f"seed={seed}: d{name} not written"
        assert x.grad.dtype == x.dtype, f"d{name} is {x.grad.dtype}, not {x.dtype}"
        err, bound = rel_err(x.grad, x_ref.grad), (grad_bounds or {}).get(name, tol_grad)
        assert err <= bound, f"seed={seed}: d{name} rel err {err:.2e} > {bound}"


def assert_matches_reference_without_final_state(op, reference, xs, names, seed, tol):
    """As `assert_matches_reference`, without asking for the final state: op returns None for it,
    and the output and every input's gradient (for the cotangent 1) match float64 within `tol`."""
    o, ht = op(*xs[:-1], initial_state=xs[-1])
    assert ht is None
    ref = [x.detach().double().requires_grad_() for x in xs]
    o_ref, _ = reference(*ref[:-1], initial_state=ref[-1])
    assert rel_err(o, o_ref) <= tol, f"seed={seed}"
    o.sum().backward()
    o_ref.sum().backward()
    for name, x, x_ref in zip(names, xs, ref):
        assert rel_err(x.grad, x_ref.grad) <= tol, f"seed={seed}: d{name}"
