"""The Titans memory's gate products in Triton (kernels/titans/gates.py), forward and backward,
against the PyTorch form and its autograd in float64: odd lengths, a sequence shorter than a
chunk, every chunk size, a factor of exactly 0 (alpha = 1, eta = 0) and of exactly 1."""
import pytest
import torch
from reference import DEVICE, case_seed, rel_err

from ltm.kernels.titans.gates import chunk_gates, triton_chunk_gates, triton_chunk_gates_bwd

NAMES = ("a", "b", "gamma", "ends", "w_last", "p_last")
# (B, T, H, chunk): shorter than a chunk, one chunk exactly, odd lengths over several chunks
CASES = [(1, 5, 1, 16), (2, 16, 3, 16), (2, 37, 2, 16), (1, 70, 2, 32), (2, 67, 1, 64)]


def make_gates(B: int, T: int, H: int, seed: int, dtype=torch.float32):
    """alpha and eta in the mixer's ranges and beyond, with exact 1s and 0s in both."""
    gen = torch.Generator().manual_seed(seed)
    alpha = 0.4 * torch.rand(B, T, H, generator=gen)
    eta = torch.rand(B, T, H, generator=gen)
    if T > 4:
        alpha[0, 2, 0], eta[-1, 3, -1] = 1.0, 0.0  # a factor of exactly zero
        alpha[-1, 4, 0], eta[0, 1, 0] = 0.0, 1.0  # and of exactly one
    return alpha.to(dtype).to(DEVICE), eta.to(dtype).to(DEVICE)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}-T{c[1]}-H{c[2]}-C{c[3]}")
def test_gate_products_match_pytorch(case):
    B, T, H, chunk = case
    alpha, eta = make_gates(B, T, H, case_seed())
    want = chunk_gates(alpha.double(), eta.double(), chunk)
    got = triton_chunk_gates(alpha, eta, chunk)
    for name, g, w in zip(NAMES, got, want):
        assert g.shape == w.shape and g.dtype == torch.float32, name
        # every element written (the buffers start empty), float32 cumulative products
        assert torch.isfinite(g).all(), name
        assert rel_err(g, w) < 1e-6, name


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}-T{c[1]}-H{c[2]}-C{c[3]}")
def test_gate_gradients_match_autograd(case):
    """The backward kernel against torch.func.vjp of the float64 PyTorch form, for random
    gradients of all six outputs (Gamma's upper triangle too: a constant 0 in both forms)."""
    B, T, H, chunk = case
    seed = case_seed()
    alpha, eta = make_gates(B, T, H, seed)
    outs, vjp = torch.func.vjp(lambda a, e: chunk_gates(a, e, chunk), alpha.double(),
                               eta.double())
    gen = torch.Generator().manual_seed(seed + 1)
    grads = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(DEVICE) for o in outs]
    want_alpha, want_eta = vjp(tuple(grads))
    got_alpha, got_eta = triton_chunk_gates_bwd(alpha, eta, chunk,
                                                tuple(g.float().contiguous() for g in grads),
                                                triton_chunk_gates(alpha, eta, chunk)[2])
    assert got_alpha.dtype == alpha.dtype and got_alpha.shape == alpha.shape
    assert rel_err(got_alpha, want_alpha) < 1e-5
    assert rel_err(got_eta, want_eta) < 1e-5


def test_gradient_through_a_zero_factor():
    """At alpha = 1 (f = 0) the gradient to f is the product of the other factors, which a
    division by the cumulative product would make 0 / 0: the kernel's is finite and autograd's."""
    B, T, H, chunk = 1, 16, 1, 16
    alpha, eta = make_gates(B, T, H, 7)
    alpha[0, 5, 0] = 1.0
    outs, vjp = torch.func.vjp(lambda a, e: chunk_gates(a, e, chunk), alpha.double(),
                               eta.double())
    grads = tuple(torch.ones_like(o) for o in outs)
    want_alpha, _ = vjp(grads)
    got_alpha, _ = triton_chunk_gates_bwd(alpha, eta, chunk, tuple(g.float() for g in grads),
                                          triton_chunk_gates(alpha, eta, chunk)[2])
    assert want_alpha[0, 5, 0] != 0  # the case exercises a nonzero gradient there
    assert torch.isfinite(got_alpha).all()
    assert rel_err(got_alpha, want_alpha) < 1e-5
