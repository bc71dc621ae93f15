"""The dual-state delta rule (ltm.ops.dual_delta_rule): its default against the stacked delta rule
it replaces, the chunked form against the token-by-token reference for every variant (forward,
backward, final state), continuations of a state that stopped inside a chunk, and what each
variant changes."""
import pytest
import torch

from ltm.ops.delta_rule import naive_delta_rule
from ltm.ops.dual_delta_rule import (chunk_dual_delta_rule, dual_delta_rule,
                                     dual_delta_rule_one_token, naive_dual_delta_rule)
from reference import DEVICE, case_seed, rel_err

VARIANTS = {"exact": ("token", None), "fast-chunk": ("chunk", None), "event": ("token", "median"),
            "both": ("chunk", "median"), "never": ("token", 1e9)}


def make_inputs(B, T, H, K, V, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen, dtype=dtype)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen, dtype=dtype), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen, dtype=dtype)
    beta = torch.rand(B, T, 2 * H, generator=gen, dtype=dtype)
    # fast decays strong, slow ones weak, as the layer initialises them
    g = -torch.rand(B, T, 2 * H, generator=gen, dtype=dtype) * torch.tensor([1.0] * H + [0.05] * H,
                                                                           dtype=dtype)
    return q, k, v, beta, g


def run(fn, inputs, variant, chunk_size, seed, **kwargs):
    """Output, final state and the gradients of a random projection of both."""
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    fast_read, threshold = variant
    o, state = fn(*leaves, fast_read=fast_read, slow_threshold=threshold, chunk_size=chunk_size,
                  **kwargs)
    gen = torch.Generator().manual_seed(seed + 1)
    # the same cotangents in every dtype and on every device: drawn in float64 on the CPU
    do = torch.randn(o.shape, generator=gen, dtype=torch.float64)
    loss = (o * do.to(o.device, o.dtype)).sum()
    dS = torch.randn(state["S"].shape, generator=gen, dtype=torch.float64)
    loss = loss + (state["S"] * dS.to(o.device, state["S"].dtype)).sum()
    return o, state, torch.autograd.grad(loss, leaves)


CASES = {"B2-T37-H3-K5-V7-C8": (2, 37, 3, 5, 7, 8), "B1-T64-H2-K8-V8-C16": (1, 64, 2, 8, 8, 16),
         "B2-T5-H1-K4-V6-C64": (2, 5, 1, 4, 6, 64), "B1-T29-H2-K6-V5-C1": (1, 29, 2, 6, 5, 1)}


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("dtype,bound", [(torch.float64, 1e-10), (torch.float32, 1e-4)],
                         ids=["f64", "f32"])
@pytest.mark.parametrize("B,T,H,K,V,C", CASES.values(), ids=CASES.keys())
def test_chunk_matches_naive(B, T, H, K, V, C, name, dtype, bound):
    seed = case_seed()
    inputs = make_inputs(B, T, H, K, V, dtype, seed)
    fast_read, threshold = VARIANTS[name]
    if threshold == "median":
        threshold = surprise_median(inputs, C)
    variant = (fast_read, threshold)
    o_ref, s_ref, g_ref = run(naive_dual_delta_rule, [x.double() for x in inputs], variant, C, seed)
    o, s, grads = run(chunk_dual_delta_rule, inputs, variant, C, seed, output_final_state=True)
    assert o.dtype == dtype and o.shape == (B, T, 2 * H, V)
    assert rel_err(o, o_ref) < bound, f"o, seed={seed}"
    assert s.keys() == s_ref.keys()
    for key in s:
        assert rel_err(s[key].double(), s_ref[key].double()) < bound, f"state {key}, seed={seed}"
    for n, grad, grad_ref in zip("q k v beta g".split(), grads, g_ref):
        assert rel_err(grad, grad_ref) < bound, f"d{n}, seed={seed}"


def surprise_median(inputs, chunk_size) -> float:
    """A threshold that keeps about half of the slow updates of full chunks (both branches run):
    the median of the chunks' surprise under the exact rule."""
    q, k, v, beta, g = (x.double() for x in inputs)
    B, T, H, _ = q.shape
    ratios, state = [], None
    for start in range(0, T - T % chunk_size, chunk_size):
        end = start + chunk_size
        _, state = dual_delta_rule(q[:, :end], k[:, :end], v[:, :end], beta[:, :end], g[:, :end],
                                   kernel="naive", chunk_size=chunk_size, slow_threshold=0.0,
                                   output_final_state=True)
        # the sums are reset at a chunk's end: rerun the chunk's last token to read them
        _, before = dual_delta_rule(q[:, :end - 1], k[:, :end - 1], v[:, :end - 1],
                                    beta[:, :end - 1], g[:, :end - 1], kernel="naive",
                                    chunk_size=chunk_size, slow_threshold=0.0,
                                    output_final_state=True) if chunk_size > 1 else (None, None)
        if before is None:
            continue
        ratios.append((before["err"] / before["ref"].clamp_min(1e-30)).flatten())
    if not ratios:
        return 0.5
    return torch.cat(ratios).median().item()


def test_default_equals_the_stacked_delta_rule():
    seed = case_seed()
    q, k, v, beta, g = make_inputs(2, 21, 3, 6, 5, torch.float64, seed)
    stacked = [torch.cat([x, x], dim=2) for x in (q, k, v)]
    o_ref, s_ref = naive_delta_rule(*stacked, beta, g, output_final_state=True)
    for kernel in ("naive", "torch"):
        o, s = dual_delta_rule(q, k, v, beta, g, kernel=kernel, chunk_size=8,
                               output_final_state=True)
        assert rel_err(o, o_ref) < 1e-12 and rel_err(s["S"], s_ref) < 1e-12, kernel
        assert set(s) == {"S"}


def test_threshold_zero_is_the_exact_rule_and_infinity_freezes_the_slow_state():
    seed = case_seed()
    q, k, v, beta, g = make_inputs(1, 24, 2, 4, 4, torch.float64, seed)
    exact, s_exact = dual_delta_rule(q, k, v, beta, g, kernel="torch", chunk_size=8,
                                     output_final_state=True)
    zero, s_zero = dual_delta_rule(q, k, v, beta, g, kernel="torch", chunk_size=8,
                                   slow_threshold=0.0, output_final_state=True)
    assert rel_err(zero, exact) < 1e-12 and rel_err(s_zero["S"], s_exact["S"]) < 1e-12
    frozen, s_frozen = dual_delta_rule(q, k, v, beta, g, kernel="torch", chunk_size=8,
                                       slow_threshold=1e9, output_final_state=True)
    # three full chunks, none kept: the slow state is still the zero state it started from
    assert s_frozen["S"][:, 2:].abs().max() == 0 and s_frozen["commit"].abs().max() == 0
    # the fast heads are untouched by the slow state's events
    assert rel_err(frozen[:, :, :2], exact[:, :, :2]) < 1e-12
    # the first chunk is read as it runs either way: only later chunks differ
    assert rel_err(frozen[:, :8], exact[:, :8]) < 1e-12
    assert rel_err(frozen[:, 8:, 2:], exact[:, 8:, 2:]) > 1e-3


def test_fast_chunk_read_is_the_chunk_start_state_decayed():
    """fast_read='chunk': o_t = scale q_t^T exp(G_t) S_fast(chunk start), S_fast the exact rule."""
    seed = case_seed()
    q, k, v, beta, g = make_inputs(1, 13, 2, 4, 3, torch.float64, seed)
    C, H = 5, 2
    o, _ = dual_delta_rule(q, k, v, beta, g, kernel="torch", chunk_size=C, fast_read="chunk")
    for t in range(13):
        start = t - t % C
        _, S0 = naive_delta_rule(q[:, :start], k[:, :start], v[:, :start], beta[:, :start, :H],
                                 g[:, :start, :H], output_final_state=True)
        G = g[:, start:t + 1, :H].sum(1)  # (B, H)
        expected = torch.einsum("bhk,bhkv->bhv", q[:, t] * 4 ** -0.5, S0 * G.exp()[..., None, None])
        assert rel_err(o[:, t, :H], expected) < 1e-12, t
    exact, _ = dual_delta_rule(q, k, v, beta, g, kernel="torch", chunk_size=C)
    assert rel_err(o[:, :, H:], exact[:, :, H:]) < 1e-12  # the slow heads are unchanged


def test_triton_kernel_runs_both_states_and_matches_the_token_loop():
    """kernel "triton" without variants: the Triton delta rule with grouped heads (both states of
    a head over one q, k, v). Against the naive dual rule in float64: forward, final state, every
    gradient, and a continuation from a state; a variant still takes the torch chunk form."""
    pytest.importorskip("triton")
    seed = case_seed()
    inputs = [x.to(DEVICE) for x in make_inputs(2, 70, 3, 32, 32, torch.float32, seed)]
    variant = ("token", None)
    o, state, grads = run(dual_delta_rule, inputs, variant, 64, seed, kernel="triton",
                          output_final_state=True)
    o_ref, s_ref, g_ref = run(naive_dual_delta_rule, [x.double() for x in inputs], variant, 64,
                              seed)
    assert set(state) == {"S"} and state["S"].dtype == torch.float32
    assert rel_err(o, o_ref) < 1e-4 and rel_err(state["S"], s_ref["S"]) < 1e-4, f"seed={seed}"
    for name, grad, grad_ref in zip(("q", "k", "v", "beta", "g"), grads, g_ref):
        assert rel_err(grad, grad_ref) < 1e-4, f"seed={seed}: d{name}"
    head, tail = [x[:, :40] for x in inputs], [x[:, 40:] for x in inputs]
    _, first = dual_delta_rule(*head, kernel="triton", chunk_size=64, output_final_state=True)
    rest, _ = dual_delta_rule(*tail, kernel="triton", chunk_size=64, state=first)
    assert rel_err(rest, o_ref[:, 40:]) < 1e-4, f"seed={seed}"
    event, _ = dual_delta_rule(*inputs, kernel="triton", chunk_size=8, slow_threshold=1e9)
    frozen, _ = dual_delta_rule(*inputs, kernel="torch", chunk_size=8, slow_threshold=1e9)
    assert torch.equal(event, frozen)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("split", [0, 3, 8, 11])
def test_prefill_then_continue_equals_one_call(name, split):
    """A prefill of `split` tokens, then the rest by one sequence call (split inside a chunk:
    the entry point steps to the boundary first) and by single steps, equals one call."""
    seed = case_seed()
    inputs = make_inputs(2, 27, 2, 4, 5, torch.float64, seed)
    fast_read, threshold = VARIANTS[name]
    variant = dict(fast_read=fast_read, slow_threshold=0.2 if threshold == "median" else threshold,
                   chunk_size=8)
    whole, s_whole = dual_delta_rule(*inputs, kernel="torch", output_final_state=True, **variant)
    head = [x[:, :split] for x in inputs]
    tail = [x[:, split:] for x in inputs]
    o1, state = dual_delta_rule(*head, kernel="torch", output_final_state=True, **variant)
    o2, s_seq = dual_delta_rule(*tail, kernel="torch", state=state, output_final_state=True,
                                **variant)
    assert rel_err(torch.cat([o1, o2], 1), whole) < 1e-12
    steps = []
    for t in range(27 - split):
        o, state = dual_delta_rule_one_token(*(x[:, t] for x in tail), state, **variant)
        steps.append(o)
    assert rel_err(torch.cat([o1, torch.stack(steps, 1)], 1), whole) < 1e-12
    for key in s_whole:
        assert rel_err(state[key].double(), s_whole[key].double()) < 1e-12, key
        assert rel_err(s_seq[key].double(), s_whole[key].double()) < 1e-12, key


def test_rows_at_different_chunk_positions_are_refused_by_a_sequence_call():
    q, k, v, beta, g = make_inputs(2, 4, 1, 4, 4, torch.float64, 0)
    _, state = dual_delta_rule(q, k, v, beta, g, kernel="torch", chunk_size=8, fast_read="chunk",
                               output_final_state=True)
    state["pos"] = torch.tensor([4, 5])
    with pytest.raises(ValueError, match="different positions"):
        dual_delta_rule(q, k, v, beta, g, kernel="torch", chunk_size=8, fast_read="chunk",
                        state=state)


@pytest.mark.parametrize("kwargs,match", [({"fast_read": "x"}, "fast_read"),
                                          ({"slow_threshold": -1.0}, "slow_threshold"),
                                          ({"chunk_size": 0}, "chunk_size")])
def test_bad_variant_one_line_errors(kwargs, match):
    q, k, v, beta, g = make_inputs(1, 4, 1, 4, 4, torch.float64, 0)
    with pytest.raises(ValueError, match=match):
        dual_delta_rule(q, k, v, beta, g, kernel="torch", **{"chunk_size": 4, **kwargs})


def test_output_dtype_follows_v_and_autocast_leaves_the_recurrence_in_float32():
    q, k, v, beta, g = make_inputs(1, 20, 2, 4, 4, torch.float32, case_seed())
    o, _ = dual_delta_rule(q, k, v.bfloat16(), beta, g, kernel="torch", chunk_size=8)
    assert o.dtype == torch.bfloat16
    plain, _ = dual_delta_rule(q, k, v, beta, g, kernel="torch", chunk_size=8)
    with torch.autocast("cpu", torch.bfloat16):
        auto, _ = dual_delta_rule(q, k, v, beta, g, kernel="torch", chunk_size=8)
    assert auto.dtype == torch.float32 and rel_err(auto, plain) < 1e-6
