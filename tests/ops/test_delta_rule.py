"""The step and chunked forms of the delta rule against the token-by-token reference."""
import pytest
import torch

from ltm.ops.delta_rule import chunk_delta_rule, delta_rule_step, naive_delta_rule
from reference import case_seed, forward_and_grads, rel_err

NAMES = ("q", "k", "v", "beta", "g")


def make_inputs(B, T, H, K, V, dtype, seed, decay="weak"):
    """Random delta-rule inputs: unit-norm keys (as the mixers feed them), beta in (0, 1), g the
    per-token log decay in (-10, 0) for "strong", (-0.02, 0) for "weak", None for "none"."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen, dtype=dtype)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen, dtype=dtype), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen, dtype=dtype)
    beta = torch.rand(B, T, H, generator=gen, dtype=dtype)
    g = None
    if decay != "none":
        low = -10.0 if decay == "strong" else -0.02
        g = low * torch.rand(B, T, H, generator=gen, dtype=dtype)
    state = torch.randn(B, H, K, V, generator=gen, dtype=dtype)
    return {"q": q, "k": k, "v": v, "beta": beta, "g": g, "initial_state": state}


def check_chunk_against_naive(inputs, seed, bound, chunk_size, **kwargs):
    """chunk_delta_rule on `inputs` against naive_delta_rule in float64 on the same values."""
    exact = {n: None if x is None else x.double() for n, x in inputs.items()}
    o_ref, s_ref, grads_ref = forward_and_grads(naive_delta_rule, exact, seed, **kwargs)
    o, s, grads = forward_and_grads(chunk_delta_rule, inputs, seed, chunk_size=chunk_size, **kwargs)
    assert o.dtype == inputs["v"].dtype, f"seed={seed}"
    assert rel_err(o.double(), o_ref) < bound, f"o, seed={seed}"
    if kwargs.get("output_final_state"):
        assert s.dtype == torch.promote_types(inputs["q"].dtype, torch.float32)
        assert rel_err(s.double(), s_ref) < bound, f"final state, seed={seed}"
    else:
        assert s is None
    for name, grad_ref in grads_ref.items():
        assert rel_err(grads[name].double(), grad_ref) < bound, f"d{name}, seed={seed}"


CHUNK_CASES = {
    "B2-T63-H3-K16-V32-C16": (2, 63, 3, 16, 32, 16),
    "B1-T1-H2-K16-V16-C16": (1, 1, 2, 16, 16, 16),
    "B2-T5-H2-K8-V16-C16": (2, 5, 2, 8, 16, 16),
    "B1-T32-H2-K16-V8-C32": (1, 32, 2, 16, 8, 32),
    "B1-T67-H1-K32-V16-C32": (1, 67, 1, 32, 16, 32),
    "B2-T19-H2-K8-V8-C7": (2, 19, 2, 8, 8, 7),
    "B1-T70-H1-K16-V16-C64": (1, 70, 1, 16, 16, 64),
}


@pytest.mark.parametrize("dtype,bound", [(torch.float64, 1e-9), (torch.float32, 1e-4)],
                         ids=["f64", "f32"])
@pytest.mark.parametrize("decay", ["strong", "weak", "none"])
@pytest.mark.parametrize("B,T,H,K,V,C", CHUNK_CASES.values(), ids=CHUNK_CASES.keys())
def test_chunk_matches_naive(B, T, H, K, V, C, decay, dtype, bound):
    seed = case_seed()
    inputs = make_inputs(B, T, H, K, V, dtype, seed, decay)
    check_chunk_against_naive(inputs, seed, bound, chunk_size=C, output_final_state=True)


@pytest.mark.parametrize("decay", ["strong", "weak", "none"])
def test_chunk_without_states_and_with_scale(decay):
    seed = case_seed()
    inputs = make_inputs(2, 37, 2, 16, 8, torch.float64, seed, decay)
    inputs["initial_state"] = None
    check_chunk_against_naive(inputs, seed, 1e-9, chunk_size=16, scale=0.3)


def test_chunk_low_precision_dtypes():
    seed = case_seed()
    inputs = make_inputs(1, 20, 2, 16, 16, torch.bfloat16, seed, "weak")
    o, state = chunk_delta_rule(**inputs, output_final_state=True, chunk_size=16)
    o_ref, state_ref = naive_delta_rule(**inputs, output_final_state=True)
    assert o.dtype == torch.bfloat16 and state.dtype == torch.float32
    assert rel_err(state, state_ref) < 1e-5, f"seed={seed}"
    assert rel_err(o.float(), o_ref.float()) < 1e-2, f"seed={seed}"


def test_chunk_compiles_without_graph_breaks():
    seed = case_seed()
    inputs = make_inputs(1, 21, 2, 8, 8, torch.float32, seed, "strong")
    compiled = torch.compile(chunk_delta_rule, backend="eager", fullgraph=True)
    o, state = compiled(**inputs, output_final_state=True, chunk_size=8)
    o_ref, state_ref = naive_delta_rule(**inputs, output_final_state=True)
    assert rel_err(o, o_ref) < 1e-4 and rel_err(state, state_ref) < 1e-4, f"seed={seed}"


def test_chunk_rejects_bad_shapes():
    x = make_inputs(2, 6, 3, 8, 4, torch.float32, 0)
    q, k, v, beta, g = (x[n] for n in NAMES)
    with pytest.raises(ValueError, match="k must be"):
        chunk_delta_rule(q, k[..., :4], v, beta)
    with pytest.raises(ValueError, match="v must be"):
        chunk_delta_rule(q, k, v[:, :5], beta)
    with pytest.raises(ValueError, match="beta must be"):
        chunk_delta_rule(q, k, v, beta[..., None])
    with pytest.raises(ValueError, match="g must be"):
        chunk_delta_rule(q, k, v, beta, g[:, :, :2])
    with pytest.raises(ValueError, match="initial_state must be"):
        chunk_delta_rule(q, k, v, beta, g, initial_state=torch.zeros(2, 3, 4, 8))
    with pytest.raises(ValueError, match="chunk_size must be"):
        chunk_delta_rule(q, k, v, beta, chunk_size=0)


@pytest.mark.parametrize("B,T,H,K,V", [(2, 7, 3, 16, 32), (1, 5, 2, 8, 8)],
                         ids=["B2-T7-H3-K16-V32", "B1-T5-H2-K8-V8"])
@pytest.mark.parametrize("decay", ["strong", "none"])
def test_step_matches_naive(B, T, H, K, V, decay):
    seed = case_seed()
    x = make_inputs(B, T, H, K, V, torch.float64, seed, decay)
    o_ref, s_ref = naive_delta_rule(**x, scale=0.7, output_final_state=True)
    state = x["initial_state"]
    outputs = []
    for t in range(T):
        g_t = None if x["g"] is None else x["g"][:, t]
        o_t, state = delta_rule_step(x["q"][:, t], x["k"][:, t], x["v"][:, t], x["beta"][:, t],
                                     g_t, 0.7, state)
        outputs.append(o_t)
    o = torch.stack(outputs, dim=1)
    assert rel_err(o, o_ref) < 1e-12, f"seed={seed}"
    assert rel_err(state, s_ref) < 1e-12, f"seed={seed}"
    assert state.dtype == torch.float64


def test_step_dtypes_and_zero_state():
    seed = case_seed()
    x = make_inputs(2, 1, 3, 8, 4, torch.float32, seed)
    q, k, v, beta, g = (x[n][:, 0].to(torch.bfloat16) for n in NAMES)
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
