"""The step and chunked forms of RWKV-7 against the token-by-token reference."""
import pytest
import torch

from ltm.ops.rwkv7 import chunk_rwkv7, naive_rwkv7, rwkv7_step
from reference import case_seed, forward_and_grads, rel_err

NAMES = ("r", "w", "k", "v", "a", "b")


def make_inputs(B, T, H, K, V, dtype, seed, decay="weak"):
    """Random RWKV-7 inputs shaped as in the model: a = -kk, b = kk * a_lr with kk unit-norm and
    a_lr in (0, 1); w the per-channel log decay in (-10, 0) for "strong", (-0.02, 0) for "weak"."""
    gen = torch.Generator().manual_seed(seed)
    r = torch.randn(B, T, H, K, generator=gen, dtype=dtype)
    low = -10.0 if decay == "strong" else -0.02
    w = low * torch.rand(B, T, H, K, generator=gen, dtype=dtype)
    k = torch.randn(B, T, H, K, generator=gen, dtype=dtype) * K ** -0.5
    v = torch.randn(B, T, H, V, generator=gen, dtype=dtype)
    kk = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen, dtype=dtype), dim=-1)
    a_lr = torch.rand(B, T, H, K, generator=gen, dtype=dtype)
    state = torch.randn(B, H, K, V, generator=gen, dtype=dtype)
    return {"r": r, "w": w, "k": k, "v": v, "a": -kk, "b": kk * a_lr, "initial_state": state}


def check_chunk_against_naive(inputs, seed, bound, chunk_size, **kwargs):
    """chunk_rwkv7 on `inputs` against naive_rwkv7 in float64 on the same values."""
    exact = {n: None if x is None else x.double() for n, x in inputs.items()}
    o_ref, s_ref, grads_ref = forward_and_grads(naive_rwkv7, exact, seed, **kwargs)
    o, s, grads = forward_and_grads(chunk_rwkv7, inputs, seed, chunk_size=chunk_size, **kwargs)
    assert o.dtype == inputs["v"].dtype, f"seed={seed}"
    assert rel_err(o.double(), o_ref) < bound, f"o, seed={seed}"
    if kwargs.get("output_final_state"):
        assert s.dtype == torch.promote_types(inputs["r"].dtype, torch.float32)
        assert rel_err(s.double(), s_ref) < bound, f"final state, seed={seed}"
    else:
        assert s is None
    for name, grad_ref in grads_ref.items():
        assert rel_err(grads[name].double(), grad_ref) < bound, f"d{name}, seed={seed}"


CHUNK_CASES = {
    "B2-T63-H3-K16-V32-C16": (2, 63, 3, 16, 32, 16),
    "B1-T1-H2-K16-V16-C16": (1, 1, 2, 16, 16, 16),
    "B2-T5-H2-K8-V16-C16": (2, 5, 2, 8, 16, 16),
    "B1-T16-H2-K16-V8-C16": (1, 16, 2, 16, 8, 16),
    "B1-T35-H1-K16-V32-C16": (1, 35, 1, 16, 32, 16),
    "B1-T67-H1-K32-V16-C32": (1, 67, 1, 32, 16, 32),
    "B2-T19-H2-K8-V8-C7": (2, 19, 2, 8, 8, 7),
}


@pytest.mark.parametrize("dtype,bound", [(torch.float64, 1e-9), (torch.float32, 1e-4)],
                         ids=["f64", "f32"])
@pytest.mark.parametrize("decay", ["strong", "weak"])
@pytest.mark.parametrize("B,T,H,K,V,C", CHUNK_CASES.values(), ids=CHUNK_CASES.keys())
def test_chunk_matches_naive(B, T, H, K, V, C, decay, dtype, bound):
    seed = case_seed()
    inputs = make_inputs(B, T, H, K, V, dtype, seed, decay)
    check_chunk_against_naive(inputs, seed, bound, chunk_size=C, output_final_state=True)


@pytest.mark.parametrize("decay", ["strong", "weak"])
def test_chunk_without_states(decay):
    seed = case_seed()
    inputs = make_inputs(2, 37, 2, 16, 8, torch.float64, seed, decay)
    inputs["initial_state"] = None
    check_chunk_against_naive(inputs, seed, 1e-9, chunk_size=16)


def test_chunk_low_precision_dtypes():
    seed = case_seed()
    inputs = make_inputs(1, 20, 2, 16, 16, torch.bfloat16, seed, "weak")
    o, state = chunk_rwkv7(**inputs, output_final_state=True)
    o_ref, state_ref = naive_rwkv7(**inputs, output_final_state=True)
    assert o.dtype == torch.bfloat16 and state.dtype == torch.float32
    assert rel_err(state, state_ref) < 1e-5, f"seed={seed}"
    assert rel_err(o.float(), o_ref.float()) < 1e-2, f"seed={seed}"


def test_chunk_compiles_without_graph_breaks():
    seed = case_seed()
    inputs = make_inputs(1, 21, 2, 8, 8, torch.float32, seed, "strong")
    compiled = torch.compile(chunk_rwkv7, backend="eager", fullgraph=True)
    o, state = compiled(**inputs, output_final_state=True, chunk_size=8)
    o_ref, state_ref = naive_rwkv7(**inputs, output_final_state=True)
    assert rel_err(o, o_ref) < 1e-4 and rel_err(state, state_ref) < 1e-4, f"seed={seed}"


def test_chunk_rejects_bad_shapes():
    x = make_inputs(2, 6, 3, 8, 4, torch.float32, 0)
    r, w, k, v, a, b = (x[n] for n in NAMES)
    with pytest.raises(ValueError, match="w must be"):
        chunk_rwkv7(r, w[..., :4], k, v, a, b)
    with pytest.raises(ValueError, match="b must be"):
        chunk_rwkv7(r, w, k, v, a, b[:, :5])
    with pytest.raises(ValueError, match="v must be"):
        chunk_rwkv7(r, w, k, v[:, :5], a, b)
    with pytest.raises(ValueError, match="initial_state must be"):
        chunk_rwkv7(r, w, k, v, a, b, initial_state=torch.zeros(2, 3, 4, 8))
    with pytest.raises(ValueError, match="chunk_size must be"):
        chunk_rwkv7(r, w, k, v, a, b, chunk_size=-1)


@pytest.mark.parametrize("B,T,H,K,V", [(2, 7, 3, 16, 32), (1, 5, 2, 8, 8)],
                         ids=["B2-T7-H3-K16-V32", "B1-T5-H2-K8-V8"])
@pytest.mark.parametrize("decay", ["strong", "weak"])
def test_step_matches_naive(B, T, H, K, V, decay):
    seed = case_seed()
    x = make_inputs(B, T, H, K, V, torch.float64, seed, decay)
    o_ref, s_ref = naive_rwkv7(**x, output_final_state=True)
    state = x["initial_state"]
    outputs = []
    for t in range(T):
        o_t, state = rwkv7_step(*(x[n][:, t] for n in NAMES), state)
        outputs.append(o_t)
    o = torch.stack(outputs, dim=1)
    assert rel_err(o, o_ref) < 1e-12, f"seed={seed}"
    assert rel_err(state, s_ref) < 1e-12, f"seed={seed}"
    assert state.dtype == torch.float64


def test_step_dtypes_and_zero_state():
    seed = case_seed()
    x = make_inputs(2, 1, 3, 8, 4, torch.float32, seed)
    inputs = [x[n][:, 0].to(torch.bfloat16) for n in NAMES]
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
