"""The step and chunked forms of the delta rule against the token-by-token reference."""
import random

import pytest
import torch

from ltm.ops.delta_rule import delta_rule_step, naive_delta_rule


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def make_inputs(B, T, H, K, V, dtype, seed, decay="weak", gated=True, requires_grad=False):
    """Random delta-rule inputs: unit-norm keys (as the mixers feed them), beta in (0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen, dtype=dtype)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen, dtype=dtype), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen, dtype=dtype)
    beta = torch.rand(B, T, H, generator=gen, dtype=dtype)
    g = None
    if gated:
        low = -10.0 if decay == "strong" else -0.02
        g = low * torch.rand(B, T, H, generator=gen, dtype=dtype)
    state = torch.randn(B, H, K, V, generator=gen, dtype=dtype)
    inputs = {"q": q, "k": k, "v": v, "beta": beta, "g": g, "initial_state": state}
    if requires_grad:
        for x in inputs.values():
            if x is not None:
                x.requires_grad_(True)
    return inputs


@pytest.mark.parametrize("B,T,H,K,V", [(2, 7, 3, 16, 32), (1, 5, 2, 8, 8)],
                         ids=["B2-T7-H3-K16-V32", "B1-T5-H2-K8-V8"])
@pytest.mark.parametrize("gated", [True, False], ids=["gated", "ungated"])
def test_step_matches_naive(B, T, H, K, V, gated):
    seed = random.randrange(2**31)
    x = make_inputs(B, T, H, K, V, torch.float64, seed, gated=gated)
    o_ref, s_ref = naive_delta_rule(**x, scale=0.7, output_final_state=True)
    state = x["initial_state"]
    outputs = []
    for t in range(T):
        g_t = x["g"][:, t] if gated else None
        o_t, state = delta_rule_step(x["q"][:, t], x["k"][:, t], x["v"][:, t], x["beta"][:, t],
                                     g_t, 0.7, state)
        outputs.append(o_t)
    o = torch.stack(outputs, dim=1)
    assert rel_err(o, o_ref) < 1e-12, f"seed={seed}"
    assert rel_err(state, s_ref) < 1e-12, f"seed={seed}"
    assert state.dtype == torch.float64


def test_step_dtypes_and_zero_state():
    seed = random.randrange(2**31)
    x = make_inputs(2, 1, 3, 8, 4, torch.float32, seed)
    q, k, v, beta, g = (x[n][:, 0].to(torch.bfloat16) for n in ("q", "k", "v", "beta", "g"))
    o, state = delta_rule_step(q, k, v, beta, g, None, None)
    o_ref, s_ref = naive_delta_rule(q[:, None], k[:, None], v[:, None], beta[:, None], g[:, None],
                                    output_final_state=True)
    assert o.dtype == torch.bfloat16 and state.dtype == torch.float32
    assert rel_err(state, s_ref) < 1e-6, f"seed={seed}"
    assert rel_err(o.float(), o_ref[:, 0].float()) < 1e-2, f"seed={seed}"


def test_step_rejects_bad_shapes():
    q = torch.randn(2, 3, 8)
    v = torch.randn(2, 3, 4)
    beta = torch.rand(2, 3)
    with pytest.raises(ValueError, match="k must be"):
        delta_rule_step(q, q[:, :, :4], v, beta)
    with pytest.raises(ValueError, match="beta must be"):
        delta_rule_step(q, q, v, beta[:, :2])
    with pytest.raises(ValueError, match="state must be"):
        delta_rule_step(q, q, v, beta, None, None, torch.zeros(2, 3, 4, 8))
