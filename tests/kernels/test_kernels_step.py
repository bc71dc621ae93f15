"""The Triton one-token step kernels against the torch step forms and, over many steps, the
float64 token loops."""
import pytest
import torch
import torch.nn.functional as F

from reference import DEVICE, DTYPES, ON_GPU, TOLERANCE, case_seed, rel_err
from ltm.kernels.delta_rule import triton_delta_rule_step
from ltm.kernels.rwkv7 import triton_rwkv7_step
from ltm.ops.delta_rule.naive import naive_delta_rule
from ltm.ops.rwkv7.naive import naive_rwkv7

SHAPES = [(1, 1, 32, 32), (2, 3, 32, 64), (3, 2, 64, 32)] + ([(4, 8, 128, 128)] if ON_GPU else [])
IDS = [f"B{B}-H{H}-K{K}-V{V}" for B, H, K, V in SHAPES]
STEPS = 7


def decode(step, per_token, state):
    outputs = []
    for t in range(per_token[0].shape[1]):
        o, state = step(*(x[:, t] for x in per_token), state)
        outputs.append(o)
    return torch.stack(outputs, dim=1), state


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("B,H,K,V", SHAPES, ids=IDS)
def test_delta_rule_steps_follow_the_token_loop(B, H, K, V, dtype):
    seed = case_seed()
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, STEPS, H, K, generator=gen)
    k = F.normalize(torch.randn(B, STEPS, H, K, generator=gen), dim=-1)
    v = torch.randn(B, STEPS, H, V, generator=gen)
    beta = torch.rand(B, STEPS, H, generator=gen)
    g = -3 * torch.rand(B, STEPS, H, generator=gen)
    h0 = torch.randn(B, H, K, V, generator=gen)
    xs = [x.to(dtype).to(DEVICE) for x in (q, k, v, beta)] + [g.to(DEVICE)]
    step = lambda q, k, v, beta, g, s: triton_delta_rule_step(q, k, v, beta, g, None, s)
    o, state = decode(step, xs, h0.to(DEVICE))
    o_ref, state_ref = naive_delta_rule(*(x.double() for x in xs), initial_state=h0.to(DEVICE).double(),
                                        output_final_state=True)
    tol = TOLERANCE[dtype][0]
    assert o.dtype == dtype and state.dtype == torch.float32
    assert rel_err(o, o_ref) <= tol, f"seed={seed}: o rel err {rel_err(o, o_ref):.2e}"
    assert rel_err(state, state_ref) <= tol, f"seed={seed}: state rel err {rel_err(state, state_ref):.2e}"
    # no decay and no state: g=None and state=None mean zero log decay and a zero state
    o1, s1 = triton_delta_rule_step(*(x[:, 0] for x in xs[:4]), None, 0.5, None)
    o1_ref, s1_ref = naive_delta_rule(*(x[:, :1].double() for x in xs[:4]), scale=0.5,
                                      output_final_state=True)
    assert rel_err(o1, o1_ref[:, 0]) <= tol and rel_err(s1, s1_ref) <= tol, f"seed={seed}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("B,H,K,V", SHAPES, ids=IDS)
def test_rwkv7_steps_follow_the_token_loop(B, H, K, V, dtype):
    seed = case_seed()
    gen = torch.Generator().manual_seed(seed)
    r = torch.randn(B, STEPS, H, K, generator=gen)
    w = -3 * torch.rand(B, STEPS, H, K, generator=gen)
    k = 0.5 * torch.randn(B, STEPS, H, K, generator=gen)
    v = torch.randn(B, STEPS, H, V, generator=gen)
    kk = F.normalize(torch.randn(B, STEPS, H, K, generator=gen), dim=-1)
    a, b = -kk, kk * torch.rand(B, STEPS, H, K, generator=gen)
    h0 = torch.randn(B, H, K, V, generator=gen)
    xs = [x.to(dtype).to(DEVICE) for x in (r, w, k, v, a, b)]
    o, state = decode(triton_rwkv7_step, xs, h0.to(DEVICE))
    o_ref, state_ref = naive_rwkv7(*(x.double() for x in xs), initial_state=h0.to(DEVICE).double(),
                                   output_final_state=True)
    tol = TOLERANCE[dtype][0]
    assert o.dtype == dtype and state.dtype == torch.float32
    assert rel_err(o, o_ref) <= tol, f"seed={seed}: o rel err {rel_err(o, o_ref):.2e}"
    assert rel_err(state, state_ref) <= tol, f"seed={seed}: state rel err {rel_err(state, state_ref):.2e}"
    o1, s1 = triton_rwkv7_step(*(x[:, 0] for x in xs), None)
    o1_ref, s1_ref = naive_rwkv7(*(x[:, :1].double() for x in xs), output_final_state=True)
    assert rel_err(o1, o1_ref[:, 0]) <= tol and rel_err(s1, s1_ref) <= tol, f"seed={seed}"


def test_step_inputs_are_checked():
    x = torch.zeros(2, 3, 32, device=DEVICE)
    beta = torch.zeros(2, 3, device=DEVICE)
    with pytest.raises(ValueError, match=r"^beta must be \[B, H\]"):
        triton_delta_rule_step(x, x, x, beta[:, :2])
    with pytest.raises(ValueError, match=r"^state must be \[B, H, K, V\]"):
        triton_delta_rule_step(x, x, x, beta, state=torch.zeros(2, 3, 32, 8, device=DEVICE))
    with pytest.raises(ValueError, match=r"^a must be \[B, H, K\]"):
        triton_rwkv7_step(x, x, x, x, x[:, :, :16], x)
    with pytest.raises(ValueError, match=r"^v must be \[B, H, D\]"):
        triton_rwkv7_step(x, x, x, x[:1], x, x)
