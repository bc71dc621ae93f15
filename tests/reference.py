"""What the op tests (tests/ops) and the kernel tests (tests/kernels) share: the seed of each case,
the relative error, the device, and the comparisons against a float64 reference.

Seeds. By default every case has a fixed seed of its own, derived from its pytest id, so a run
repeats the last one exactly. `LTM_TEST_SEED=random` draws a fresh seed per case instead and
prints it (pytest shows the print with a failure); `LTM_TEST_SEED=<n>` runs with seed n, to
replay a failure:

    LTM_TEST_SEED=random .venv/bin/python -m pytest -q tests/ops/test_delta_rule.py
    LTM_TEST_SEED=123456 .venv/bin/python -m pytest -q "tests/ops/test_delta_rule.py::test_x[...]"

Every failure message names the seed.
"""
from __future__ import annotations

import os
import random
import zlib

import torch

SEED_VARIABLE = "LTM_TEST_SEED"

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ON_GPU = DEVICE.type == "cuda"

# The kernel tests' relative-error bounds ||a - b|| / ||b|| against a float64 reference: (outputs,
# gradients). float32 runs with exact fp32 dot products (input_precision="ieee"); half inputs are
# rounded to 8 (bf16) or 11 (fp16) mantissa bits in the outputs and gradients the kernels write.
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (5e-3, 1e-2), torch.float16: (5e-3, 1e-2)}
# the interpreter computes in numpy, which has no bfloat16: half precision runs on the GPU only
DTYPES = (torch.float32, torch.bfloat16, torch.float16) if ON_GPU else (torch.float32,)


def case_seed() -> int:
    """The seed of the running test case: fixed by default, see the module docstring."""
    # "tests/ops/test_x.py::test_y[case] (call)": the id of the case and the phase
    case = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    choice = os.environ.get(SEED_VARIABLE, "fixed")
    if choice == "fixed":
        return zlib.crc32(case.encode()) % 2**31
    if choice == "random":
        seed = random.SystemRandom().randrange(2**31)
        print(f"{case}: {SEED_VARIABLE}={seed} replays this case")
        return seed
    try:
        return int(choice)
    except ValueError:
        raise ValueError(f"{SEED_VARIABLE} must be 'fixed', 'random' or an integer seed, "
                         f"got {choice!r}") from None


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b||, computed in float64."""
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def case_id(B: int, T: int, H: int, K: int, V: int) -> str:
    return f"B{B}-T{T}-H{H}-D{K}" if K == V else f"B{B}-T{T}-H{H}-K{K}-V{V}"


def forward_and_grads(fn, inputs: dict, seed: int, **kwargs):
    """Outputs of `fn(**inputs, **kwargs)` and the gradients of a random projection of them
    w.r.t. every tensor input (the same projection for every call with the same seed and
    shapes)."""
    leaves = {n: x.detach().requires_grad_(True) for n, x in inputs.items() if x is not None}
    o, state = fn(**{**inputs, **leaves}, **kwargs)
    gen = torch.Generator().manual_seed(seed + 1)
    loss = (o * torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype)).sum()
    if state is not None:
        dstate = torch.randn(state.shape, generator=gen, dtype=torch.float64).to(state.dtype)
        loss = loss + (state * dstate).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return o, state, dict(zip(leaves, grads))


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
