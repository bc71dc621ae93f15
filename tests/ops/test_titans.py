"""The Titans memory: the chunked form and the one-token step against the token loop (whose
gradients come from autograd), forward and backward, float64; short sequences, a deep memory on a
long sequence, the kernel dispatch and one-line errors."""
import importlib.util

import pytest
import torch
import torch.nn.functional as F

from ltm.ops.titans import (TitansState, _auto_candidates, chunk_titans_memory, init_titans_state,
                            naive_titans_memory, titans_memory, titans_memory_one_token,
                            titans_memory_step)
from reference import case_seed, rel_err

pytestmark = pytest.mark.usefixtures("one_thread")

NAMES = ("q", "k", "v", "theta", "alpha", "eta")
# float64 against float64: the forms differ by rounding only (measured <= 1e-13 everywhere,
# mostly ~1e-15); the bound leaves room for the deep memories' longer chains of products
BOUND = 1e-10
HIDDEN = 6


def make_inputs(B, T, H, K, V, depth, seed, dtype=torch.float64, theta_max=0.5):
    """Random inputs: unit-norm keys (as the mixer feeds them), theta in [0, theta_max), alpha in
    [0, 0.3) with one alpha = 1 (forget all) and one eta = 0 (no momentum) when T > 3, eta in
    [0, 1); the initial weights a chain K -> HIDDEN -> ... -> V of depth layers."""
    gen = torch.Generator().manual_seed(seed)
    x = {"q": torch.randn(B, T, H, K, generator=gen, dtype=dtype),
         "k": F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=dtype), dim=-1),
         "v": torch.randn(B, T, H, V, generator=gen, dtype=dtype),
         "theta": theta_max * torch.rand(B, T, H, generator=gen, dtype=dtype),
         "alpha": 0.3 * torch.rand(B, T, H, generator=gen, dtype=dtype),
         "eta": torch.rand(B, T, H, generator=gen, dtype=dtype)}
    if T > 3:
        x["alpha"][0, 2, 0], x["eta"][-1, 3, -1] = 1.0, 0.0
    dims = [K] + [HIDDEN] * (depth - 1) + [V]
    weights = [torch.randn(H, dims[i], dims[i + 1], generator=gen, dtype=dtype) * dims[i] ** -0.5
               for i in range(depth)]
    return x, weights


def state_tensors(state: TitansState) -> list:
    return [t for part in state[:3] for t in part]


def run_with_grads(fn, x, weights, seed, **kwargs):
    """Outputs, final state and the gradients of a random projection of both w.r.t. every input
    and initial weight."""
    leaves = [x[n].detach().clone().requires_grad_() for n in NAMES]
    w_leaves = [w.detach().clone().requires_grad_() for w in weights]
    o, state = fn(*leaves, w_leaves, output_final_state=True, **kwargs)
    gen = torch.Generator().manual_seed(seed + 1)
    loss = (o * torch.randn(o.shape, generator=gen, dtype=o.dtype).to(o.device)).sum()
    for t in state_tensors(state):
        loss = loss + (t * torch.randn(t.shape, generator=gen, dtype=t.dtype).to(t.device)).sum()
    grads = torch.autograd.grad(loss, leaves + w_leaves)
    names = list(NAMES) + [f"W{i}" for i in range(len(weights))]
    return o, state, dict(zip(names, grads))


def assert_close(got, want, seed, bound=BOUND):
    (o, s, g), (o_ref, s_ref, g_ref) = got, want
    assert rel_err(o, o_ref) < bound, f"o, seed={seed}"
    assert s.pos == s_ref.pos
    for i, (t, t_ref) in enumerate(zip(state_tensors(s), state_tensors(s_ref))):
        assert rel_err(t, t_ref) < bound, f"state tensor {i}, seed={seed}"
    for name in g_ref:
        assert rel_err(g[name], g_ref[name]) < bound, f"d{name}, seed={seed}"


# B, T, H, K, V, chunk_size: T no multiple of the chunk, T < chunk, chunk 1, odd sizes
CASES = {"B2-T23-H3-K5-V7-C4": (2, 23, 3, 5, 7, 4), "B1-T5-H2-K4-V4-C16": (1, 5, 2, 4, 4, 16),
         "B2-T9-H1-K6-V3-C1": (2, 9, 1, 6, 3, 1), "B1-T21-H2-K8-V8-C8": (1, 21, 2, 8, 8, 8)}


@pytest.mark.parametrize("grad_clip", [None, 0.4], ids=["noclip", "clip"])
@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("B,T,H,K,V,C", CASES.values(), ids=CASES.keys())
def test_chunk_matches_naive_forward_and_backward(B, T, H, K, V, C, depth, grad_clip):
    seed = case_seed()
    x, weights = make_inputs(B, T, H, K, V, depth, seed)
    kwargs = dict(chunk_size=C, grad_clip=grad_clip)
    want = run_with_grads(naive_titans_memory, x, weights, seed, **kwargs)
    got = run_with_grads(chunk_titans_memory, x, weights, seed, **kwargs)
    assert_close(got, want, seed)


@pytest.mark.parametrize("depth", [1, 2])
def test_from_a_state_inside_a_chunk(depth):
    """A sequence form continuing from a state whose position is inside a chunk (gradients at the
    stored chunk-start weights), gradients reaching the state's tensors."""
    seed = case_seed()
    x, weights = make_inputs(2, 17, 2, 5, 4, depth, seed)
    head = {n: t[:, :6] for n, t in x.items()}
    tail = {n: t[:, 6:] for n, t in x.items()}
    _, state = chunk_titans_memory(*head.values(), weights, chunk_size=4, grad_clip=0.5,
                                   output_final_state=True)
    assert state.pos == 6
    results = []
    for fn in (naive_titans_memory, chunk_titans_memory):
        start = [t.detach().clone().requires_grad_() for t in state_tensors(state)]
        L = len(weights)
        initial = TitansState(tuple(start[:L]), tuple(start[L:2 * L]), tuple(start[2 * L:]), 6)
        o, final = fn(*tail.values(), weights, chunk_size=4, grad_clip=0.5,
                      initial_state=initial, output_final_state=True)
        loss = (o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)).sum()
        loss = loss + sum(t.sum() for t in state_tensors(final))
        results.append((o, torch.autograd.grad(loss, start)))
    (o_ref, g_ref), (o, g) = results
    assert rel_err(o, o_ref) < BOUND, f"seed={seed}"
    for i, (a, b) in enumerate(zip(g, g_ref)):
        assert rel_err(a, b) < BOUND, f"d state tensor {i}, seed={seed}"


@pytest.mark.parametrize("depth", [1, 2])
def test_sequence_shorter_than_a_chunk_updates_and_reads_the_memory(depth):
    seed = case_seed()
    x, weights = make_inputs(1, 3, 2, 4, 4, depth, seed)
    o, state = chunk_titans_memory(*x.values(), weights, chunk_size=64, output_final_state=True)
    o_ref, _ = naive_titans_memory(*x.values(), weights, chunk_size=64, output_final_state=True)
    assert rel_err(o, o_ref) < BOUND, f"seed={seed}"
    assert state.pos == 3
    for w, w0 in zip(state.weights, weights):
        assert rel_err(w, w0.expand_as(w)) > 1e-3, f"the memory did not change, seed={seed}"
    # every token reads the memory after its own update, not the initial weights
    q = x["q"].transpose(1, 2)
    untouched = q @ weights[0] if depth == 1 else F.silu(q @ weights[0]) @ weights[1]
    for t in range(3):
        assert rel_err(o[:, t], untouched.transpose(1, 2)[:, t]) > 1e-4, f"token {t}, seed={seed}"


def test_deep_memory_on_a_long_sequence_stays_finite_with_clipping():
    """Depth 4, T = 512, large steps: without clipping the memory blows up (the NaN / divergence
    reported for deep memories); with grad_clip = 1 outputs and gradients stay finite."""
    seed = case_seed()
    x, weights = make_inputs(1, 512, 2, 8, 8, 4, seed, dtype=torch.float32, theta_max=5.0)
    x["eta"] = 0.9 + 0.09 * x["eta"]
    x["alpha"] = 0.01 * x["alpha"]
    o, _ = chunk_titans_memory(*x.values(), weights, chunk_size=16)
    assert not torch.isfinite(o).all(), "expected the unclipped deep memory to diverge"
    leaves = [w.clone().requires_grad_() for w in weights]
    q = x["q"].clone().requires_grad_()
    o, state = chunk_titans_memory(q, *list(x.values())[1:], leaves, chunk_size=16, grad_clip=1.0,
                                   output_final_state=True)
    assert torch.isfinite(o).all() and all(torch.isfinite(t).all() for t in state_tensors(state))
    grads = torch.autograd.grad(o.square().mean(), [q, *leaves])
    assert all(torch.isfinite(g).all() for g in grads), f"seed={seed}"


@pytest.mark.parametrize("C", [1, 4])
@pytest.mark.parametrize("depth", [1, 2])
def test_steps_equal_the_sequence_and_prefill_then_steps_too(depth, C):
    seed = case_seed()
    x, weights = make_inputs(2, 11, 3, 5, 6, depth, seed)
    o_ref, s_ref = naive_titans_memory(*x.values(), weights, chunk_size=C, grad_clip=0.5,
                                       output_final_state=True)
    for prefill in (0, 6):
        state, outputs = None, []
        if prefill:
            o, state = chunk_titans_memory(*(t[:, :prefill] for t in x.values()), weights,
                                           chunk_size=C, grad_clip=0.5, output_final_state=True)
            outputs.append(o)
        for t in range(prefill, 11):
            o, state = titans_memory_step(*(x[n][:, t] for n in NAMES), weights, state,
                                          chunk_size=C, grad_clip=0.5)
            outputs.append(o[:, None])
        assert rel_err(torch.cat(outputs, dim=1), o_ref) < BOUND, f"prefill {prefill}, seed={seed}"
        assert state.pos == s_ref.pos
        for a, b in zip(state_tensors(state), state_tensors(s_ref)):
            assert rel_err(a, b) < BOUND, f"prefill {prefill}, seed={seed}"


@pytest.mark.parametrize("form", ["naive", "step"])
def test_rows_at_their_own_positions(form):
    """A (B,) tensor position (static-cache decoding of ragged prompts): each row continues as it
    would alone, at its own place in its chunk."""
    seed = case_seed()
    x, weights = make_inputs(2, 9, 2, 5, 4, 2, seed)
    starts = (6, 3)  # chunk 4: row 0 inside its second chunk, row 1 one token before a boundary
    alone, states = [], []
    for row, start in enumerate(starts):
        inputs = {n: t[row:row + 1] for n, t in x.items()}
        _, state = chunk_titans_memory(*(t[:, :start] for t in inputs.values()), weights,
                                       chunk_size=4, grad_clip=0.5, output_final_state=True)
        states.append(state)
        # two more tokens each: the ones at positions start and start + 1
        o, _ = naive_titans_memory(*(t[:, start:start + 2] for t in inputs.values()), weights,
                                   chunk_size=4, grad_clip=0.5, initial_state=state)
        alone.append(o)
    parts = [tuple(torch.cat(ts) for ts in zip(*(s[i] for s in states))) for i in range(3)]
    batched = TitansState(*parts, torch.tensor(starts))
    rows = torch.arange(2)
    pick = [{n: t[rows, torch.tensor(starts) + j] for n, t in x.items()} for j in range(2)]
    if form == "step":
        outputs, state = [], batched
        for j in range(2):
            o, state = titans_memory_step(*pick[j].values(), weights, state, chunk_size=4,
                                          grad_clip=0.5)
            outputs.append(o)
        o = torch.stack(outputs, dim=1)
    else:
        seq = {n: torch.stack([pick[0][n], pick[1][n]], dim=1) for n in NAMES}
        o, state = naive_titans_memory(*seq.values(), weights, chunk_size=4, grad_clip=0.5,
                                       initial_state=batched, output_final_state=True)
    assert torch.equal(state.pos, torch.tensor(starts) + 2)
    assert rel_err(o, torch.cat(alone)) < BOUND, f"seed={seed}"


@pytest.mark.parametrize("kernel", ["naive", "torch"])
def test_entry_points_reach_the_forms(kernel):
    seed = case_seed()
    x, weights = make_inputs(2, 9, 2, 4, 5, 2, seed)
    o_ref, s_ref = naive_titans_memory(*x.values(), weights, chunk_size=4, grad_clip=0.5,
                                       output_final_state=True)
    o, state = titans_memory(*x.values(), weights, kernel=kernel, chunk_size=4, grad_clip=0.5,
                             output_final_state=True)
    assert rel_err(o, o_ref) < BOUND, f"seed={seed}"
    none_state = titans_memory(*x.values(), weights, kernel=kernel, chunk_size=4)[1]
    assert none_state is None
    state = None
    for t in range(9):
        o_t, state = titans_memory_one_token(*(x[n][:, t] for n in NAMES), weights, state,
                                             kernel=kernel, chunk_size=4, grad_clip=0.5)
    assert rel_err(o_t, o_ref[:, -1]) < BOUND, f"seed={seed}"
    assert rel_err(state.weights[1], s_ref.weights[1]) < BOUND, f"seed={seed}"


def test_unknown_kernel_is_one_line_error():
    x, weights = make_inputs(1, 3, 1, 4, 4, 1, 0)
    for entry in ("sequence", "token"):
        with pytest.raises(ValueError, match="unknown kernel") as info:
            if entry == "sequence":
                titans_memory(*x.values(), weights, kernel="cuda", chunk_size=1)
            else:
                titans_memory_one_token(*(x[n][:, 0] for n in NAMES), weights, None,
                                        kernel="cuda", chunk_size=1)
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("depth, chunk_size, message", [
    (3, 16, "runs the titans memory with 1 or 2 layers"), (1, 8, r"chunk_size in \(16, 32, 64\)"),
    (2, 64, r"runs the 2-layer titans memory with chunk_size in \(16, 32\)")])
def test_triton_outside_its_kernel_is_one_line_error(depth, chunk_size, message):
    x, weights = make_inputs(1, 3, 1, 4, 4, depth, 0)
    with pytest.raises(ValueError, match=message) as info:
        titans_memory(*x.values(), weights, kernel="triton", chunk_size=chunk_size)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("prefill", [0, 5])
def test_triton_runs_the_two_layer_memory(prefill):
    """kernel="triton" with a deep memory (two layers) computes what "torch" computes, from the
    first token and from a state inside a chunk (float32: the kernels take no float64); auto
    offers it (on the CPU auto runs torch)."""
    seed = case_seed()
    x, weights = make_inputs(2, 21 + prefill, 2, 5, 6, 2, seed, dtype=torch.float32)
    # the kernel on a GPU where there is one (Triton's interpreter runs it on the CPU)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x, weights = {n: t.to(device) for n, t in x.items()}, [w.to(device) for w in weights]
    assert _auto_candidates(weights, 16, 0.5, torch.float32) == ("triton",)
    def after_prefill(*inputs, kernel, **options):
        """The tokens after the prefill (by torch), from the state it leaves."""
        *tensors, weights = inputs
        state = None
        if prefill:
            _, state = titans_memory(*(t[:, :prefill] for t in tensors), weights, kernel="torch",
                                     **options)
        return titans_memory(*(t[:, prefill:] for t in tensors), weights, kernel=kernel,
                             initial_state=state, **options)

    results = [run_with_grads(after_prefill, x, weights, seed, kernel=kernel, chunk_size=16,
                              grad_clip=0.5) for kernel in ("triton", "torch")]
    assert_close(*results, seed, bound=1e-5)


@pytest.mark.skipif(importlib.util.find_spec("fla") is not None, reason="fla is installed")
def test_fla_without_fla_is_one_line():
    x, weights = make_inputs(1, 3, 1, 4, 4, 1, 0)
    with pytest.raises(ValueError, match="needs flash-linear-attention"):
        titans_memory(*x.values(), weights, kernel="fla", chunk_size=1)


@pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="fla is not installed")
def test_fla_matches_the_linear_memory_with_chunk_size_one():
    """fla's chunk_momentum_delta_rule computes the linear memory with exact per-token gradients
    (chunk_size 1); in bfloat16 it is within bf16 rounding of the float64 token loop for gates
    like the mixer's (eta near 0.9, small alpha). Its chunked form divides cumulative products in
    float32 log space: with eta down to 0.05 it drifted up to 1e-1 off the token loop (fla-core
    0.6.0 on CPU, float32, T = 70), so the gates here stay in its well-conditioned range. Other
    settings are refused in one line."""
    seed = case_seed()
    x, weights = make_inputs(2, 37, 3, 16, 16, 1, seed)
    x["alpha"], x["eta"] = 0.05 * x["alpha"], 0.8 + 0.19 * x["eta"]
    o_ref, s_ref = naive_titans_memory(*x.values(), weights, chunk_size=1, output_final_state=True)
    half = [x[n].to(torch.bfloat16) for n in NAMES]
    o, state = titans_memory(*half, weights, kernel="fla", chunk_size=1, output_final_state=True)
    assert rel_err(o.double(), o_ref) < 3e-2, f"seed={seed}"
    assert rel_err(state.weights[0], s_ref.weights[0]) < 3e-2, f"seed={seed}"
    assert rel_err(state.momenta[0], s_ref.momenta[0]) < 3e-2, f"seed={seed}"
    with pytest.raises(ValueError, match="only for the linear memory"):
        titans_memory(*half, weights, kernel="fla", chunk_size=4)


def test_dtypes_of_outputs_and_states():
    seed = case_seed()
    x, weights = make_inputs(1, 6, 2, 4, 4, 2, seed, dtype=torch.float32)
    half = [x[n].to(torch.bfloat16) for n in NAMES]
    o, state = chunk_titans_memory(*half, weights, chunk_size=4, output_final_state=True)
    o_ref, _ = naive_titans_memory(*x.values(), weights, chunk_size=4, output_final_state=True)
    assert o.dtype == torch.bfloat16 and all(t.dtype == torch.float32 for t in state_tensors(state))
    assert rel_err(o.float(), o_ref) < 3e-2, f"seed={seed}"
    o32, state = chunk_titans_memory(*x.values(), weights, chunk_size=4, output_final_state=True)
    assert o32.dtype == torch.float32 and rel_err(o32, o_ref) < 1e-5, f"seed={seed}"
    assert init_titans_state([w.double() for w in weights], 2).weights[0].dtype == torch.float64


@pytest.mark.parametrize("form", [naive_titans_memory, chunk_titans_memory, "step"],
                         ids=["naive", "chunk", "step"])
def test_bf16_autocast_keeps_the_memory_in_float32(form):
    """Under bf16 autocast (CPU here) the forms still compute in float32: the state matches the
    float32 run without autocast to float32 rounding, not bf16's."""
    seed = case_seed()
    x, weights = make_inputs(1, 9, 2, 8, 8, 2, seed, dtype=torch.float32)
    results = []
    for enabled in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            if form == "step":
                state = None
                for t in range(9):
                    o, state = titans_memory_step(*(x[n][:, t] for n in NAMES), weights, state,
                                                  chunk_size=4, grad_clip=1.0)
            else:
                o, state = form(*x.values(), weights, chunk_size=4, grad_clip=1.0,
                                output_final_state=True)
        results.append((o, state))
    (o_ref, s_ref), (o, state) = results
    assert all(t.dtype == torch.float32 for t in state_tensors(state))
    assert rel_err(o, o_ref) < 1e-6, f"seed={seed}"
    for a, b in zip(state_tensors(state), state_tensors(s_ref)):
        assert rel_err(a, b) < 1e-6, f"seed={seed}"


def test_compiles_without_graph_breaks():
    seed = case_seed()
    x, weights = make_inputs(1, 11, 2, 4, 4, 2, seed, dtype=torch.float32)
    compiled = torch.compile(chunk_titans_memory, backend="eager", fullgraph=True)
    o, _ = compiled(*x.values(), weights, chunk_size=4, grad_clip=1.0)
    o_ref, _ = naive_titans_memory(*x.values(), weights, chunk_size=4, grad_clip=1.0)
    assert rel_err(o, o_ref) < 1e-5, f"seed={seed}"


@pytest.mark.parametrize("change, message", [
    (lambda x, w: x.update(k=x["k"][..., :3]), "k must be"),
    (lambda x, w: x.update(v=x["v"][:, :2]), "v must be"),
    (lambda x, w: x.update(theta=x["theta"][..., None]), "theta must be"),
    (lambda x, w: x.update(eta=x["eta"][:, :, :1]), "eta must be"),
    (lambda x, w: x.update(q=x["q"][:, :0], k=x["k"][:, :0]), "q must be"),
    (lambda x, w: w.__setitem__(0, w[0][:, :3]), r"weights\[0\] must be"),
    (lambda x, w: w.clear(), "weights must be"),
])
def test_bad_inputs_are_one_line_errors(change, message):
    x, weights = make_inputs(2, 5, 2, 4, 4, 2, 0)
    change(x, weights)
    for fn in (naive_titans_memory, chunk_titans_memory):
        with pytest.raises(ValueError, match=message) as info:
            fn(*x.values(), weights, chunk_size=2)
        assert "\n" not in str(info.value)


def test_bad_options_and_states_are_one_line_errors():
    x, weights = make_inputs(2, 5, 2, 4, 4, 2, 0)
    for kwargs, message in ((dict(chunk_size=0), "chunk_size must be"),
                            (dict(chunk_size=2, grad_clip=0.0), "grad_clip must be"),
                            (dict(chunk_size=2, initial_state=init_titans_state(weights, 3)),
                             "state.weights must be"),
                            (dict(chunk_size=2, initial_state=init_titans_state(weights, 2)
                                  ._replace(pos=torch.zeros(2, dtype=torch.long))),
                             "state.pos must be an int")):
        with pytest.raises(ValueError, match=message) as info:
            chunk_titans_memory(*x.values(), weights, **kwargs)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="theta must be"):
        titans_memory_step(*(x[n][:, 0] for n in NAMES[:3]), x["theta"], x["alpha"][:, 0],
                           x["eta"][:, 0], weights)
