"""The Triton RWKV-7 token loop (triton_fused_recurrent_rwkv7) against the float64 reference, forward
and every gradient."""
import pytest
import torch
import torch.nn.functional as F

from reference import (DEVICE, DTYPES, ON_GPU, TOLERANCE, assert_matches_reference,
                       assert_matches_reference_without_final_state, case_id, case_seed)
from ltm.kernels.rwkv7 import triton_fused_recurrent_rwkv7
from ltm.kernels.rwkv7.fused_recurrent import CHUNK
from ltm.ops.rwkv7.naive import naive_rwkv7

# (B, T, H, K, V, decay, initial state): T = 1, T < chunk, T = chunk, odd T over several chunks;
# decay "weak" (w in [-0.05, 0]) or "strong" (w in [-10, 0] per token and channel)
CASES = [
    (1, 1, 1, 32, 32, "weak", True),
    (1, 11, 2, 32, 32, "strong", False),
    (1, CHUNK, 1, 64, 64, "weak", True),
    (2, CHUNK + 5, 1, 32, 64, "strong", True),
]
if ON_GPU:
    CASES += [(2, 300, 4, 128, 128, "weak", True), (1, 1000, 2, 64, 64, "strong", True),
              (3, 200, 2, 64, 128, "weak", False)]


def make_inputs(B, T, H, K, V, decay, with_h0, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    r = torch.randn(B, T, H, K, generator=gen)
    low = {"weak": 0.05, "strong": 10.0}[decay]
    w = -low * torch.rand(B, T, H, K, generator=gen)
    k = 0.5 * torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, H, V, generator=gen)
    # as in RWKV-7: a = -kk, b = kk * in-context learning rate, kk a unit key
    kk = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    a, b = -kk, kk * torch.rand(B, T, H, K, generator=gen)
    h0 = torch.randn(B, H, K, V, generator=gen) if with_h0 else None
    xs = [x.to(dtype) for x in (r, w, k, v, a, b)] + [h0]
    return [None if x is None else x.to(DEVICE).requires_grad_() for x in xs]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("B,T,H,K,V,decay,with_h0", CASES,
                         ids=[f"{case_id(*c[:5])}-{c[5]}-h0{int(c[6])}" for c in CASES])
def test_forward_and_gradients_match_the_token_loop(B, T, H, K, V, decay, with_h0, dtype):
    seed = case_seed()
    tol_out, tol_grad = TOLERANCE[dtype]
    xs = make_inputs(B, T, H, K, V, decay, with_h0, dtype, seed)
    assert_matches_reference(triton_fused_recurrent_rwkv7, naive_rwkv7, xs,
                             ("r", "w", "k", "v", "a", "b", "initial_state"), seed, tol_out, tol_grad)


def test_without_final_state():
    seed = case_seed()
    xs = make_inputs(1, 9, 1, 32, 32, "weak", True, torch.float32, seed)
    assert_matches_reference_without_final_state(triton_fused_recurrent_rwkv7, naive_rwkv7, xs,
                                                 ("r", "w", "k", "v", "a", "b", "h0"), seed, 1e-4)
