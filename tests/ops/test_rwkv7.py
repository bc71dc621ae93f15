"""The step and chunked forms of RWKV-7 against the token-by-token reference."""
import random

import pytest
import torch

from ltm.ops.rwkv7 import naive_rwkv7, rwkv7_step


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def make_inputs(B, T, H, K, V, dtype, seed, decay="weak", requires_grad=False):
    """Random RWKV-7 inputs shaped as in the model: a = -kk, b = kk * a_lr with kk unit-norm."""
    gen = torch.Generator().manual_seed(seed)
    r = torch.randn(B, T, H, K, generator=gen, dtype=dtype)
    low = -10.0 if decay == "strong" else -0.02
    w = low * torch.rand(B, T, H, K, generator=gen, dtype=dtype)
    k = torch.randn(B, T, H, K, generator=gen, dtype=dtype) * K ** -0.5
    v = torch.randn(B, T, H, V, generator=gen, dtype=dtype)
    kk = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen, dtype=dtype), dim=-1)
    a_lr = torch.rand(B, T, H, K, generator=gen, dtype=dtype)
    state = torch.randn(B, H, K, V, generator=gen, dtype=dtype)
    inputs = {"r": r, "w": w, "k": k, "v": v, "a": -kk, "b": kk * a_lr, "initial_state": state}
    if requires_grad:
        for x in inputs.values():
            x.requires_grad_(True)
    return inputs


@pytest.mark.parametrize("B,T,H,K,V", [(2, 7, 3, 16, 32), (1, 5, 2, 8, 8)],
                         ids=["B2-T7-H3-K16-V32", "B1-T5-H2-K8-V8"])
def test_step_matches_naive(B, T, H, K, V):
    seed = random.randrange(2**31)
    x = make_inputs(B, T, H, K, V, torch.float64, seed)
    o_ref, s_ref = naive_rwkv7(**x, output_final_state=True)
    state = x["initial_state"]
    outputs = []
    for t in range(T):
        o_t, state = rwkv7_step(*(x[n][:, t] for n in ("r", "w", "k", "v", "a", "b")), state)
        outputs.append(o_t)
    o = torch.stack(outputs, dim=1)
    assert rel_err(o, o_ref) < 1e-12, f"seed={seed}"
    assert rel_err(state, s_ref) < 1e-12, f"seed={seed}"
    assert state.dtype == torch.float64


def test_step_dtypes_and_zero_state():
    seed = random.randrange(2**31)
    x = make_inputs(2, 1, 3, 8, 4, torch.float32, seed)
    inputs = [x[n][:, 0].to(torch.bfloat16) for n in ("r", "w", "k", "v", "a", "b")]
    o, state = rwkv7_step(*inputs)
    o_ref, s_ref = naive_rwkv7(*(t[:, None] for t in inputs), output_final_state=True)
    assert o.dtype == torch.bfloat16 and state.dtype == torch.float32
    assert rel_err(state, s_ref) < 1e-6, f"seed={seed}"
    assert rel_err(o.float(), o_ref[:, 0].float()) < 1e-2, f"seed={seed}"


def test_step_rejects_bad_shapes():
    r = torch.randn(2, 3, 8)
    v = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match="w must be"):
        rwkv7_step(r, r[:, :, :4], r, v, r, r)
    with pytest.raises(ValueError, match="v must be"):
        rwkv7_step(r, r, r, v[:1], r, r)
    with pytest.raises(ValueError, match="state must be"):
        rwkv7_step(r, r, r, v, r, r, torch.zeros(2, 3, 4, 8))
