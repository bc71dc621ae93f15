"""The Triton chunked delta rule against the float64 token loop, forward and every gradient."""
import pytest
import torch
import torch.nn.functional as F

from ltm.kernels.delta_rule import triton_chunk_delta_rule
from ltm.kernels.delta_rule.chunk import CHUNK
from ltm.ops.delta_rule.naive import naive_delta_rule
from reference import (DEVICE, DTYPES, ON_GPU, TOLERANCE, assert_matches_reference, case_id,
                       case_seed, rel_err)

# (B, T, H, K, V, decay, initial state): T = 1, T < chunk, T = chunk, odd T over several chunks;
# decay "none" (g=None), "weak" (g in [-0.05, 0]), "medium" (g in [-0.25, 0]: about -8 a chunk)
# or "strong" (g in [-10, 0] per token); "mixed": medium, weak in the first head
CASES = [
    (1, 1, 1, 32, 32, "weak", True),
    (2, 37, 3, 32, 32, "none", False),
    (1, CHUNK, 2, 64, 64, "weak", True),
    (1, 2 * CHUNK + 3, 2, 32, 32, "strong", True),
    (2, 63, 1, 32, 64, "strong", False),
    (1, 100, 2, 64, 64, "strong", True),
]
if ON_GPU:
    # V = 16: the launcher's value blocks stay 32 wide (16 crashed on Hopper)
    # V < 32 (value blocks wider than the head) and V = 32 at both K: 8-warp launches of
    # `_bwd_local` went wrong at V = 16 and 32 on an H100 (launch_choices.py, `SINGLE_BLOCK_MAX_V`)
    CASES += [(2, 300, 4, 128, 128, "weak", True), (1, 1000, 2, 64, 128, "strong", True),
              (3, 200, 2, 128, 64, "none", True), (1, 70, 2, 128, 16, "weak", True),
              (1, 70, 2, 64, 16, "strong", True), (2, 200, 2, 128, 32, "strong", True),
              (2, 130, 3, 64, 32, "weak", False)]


# dg in half precision has a tail: dg of the first token with an initial state is a sum of
# terms that cancel to a fraction of their size, taken from the bf16 per-chunk states and state
# gradients. B1-T100-H2-D64, strong decay, 52 seeds on the interpreter (which rounds as the GPU
# does): median 2.7e-3, 50 below 6.2e-3, then 1.17e-2 and 2.15e-2 (seed 8), 3.2% of that one
# entry; every other gradient stayed below 4.8e-3
DG_HALF_BOUND = 3e-2


def make_inputs(B, T, H, K, V, decay, with_h0, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    # unit keys and beta in (0, 1), as a delta-rule layer feeds them, keep the state bounded
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    beta = torch.rand(B, T, H, generator=gen)
    low = {"weak": 0.05, "medium": 0.25, "strong": 10.0, "mixed": 0.25}.get(decay)
    g = None if low is None else -low * torch.rand(B, T, H, generator=gen)
    if decay == "mixed":  # medium decay, but weak (1/5 of it) in the first head
        g[:, :, 0] *= 0.2
    h0 = torch.randn(B, H, K, V, generator=gen) if with_h0 else None
    xs = [q.to(dtype), k.to(dtype), v.to(dtype), beta.to(dtype), g, h0]
    return [None if x is None else x.to(DEVICE).requires_grad_() for x in xs]


def run_both(xs, output_final_state=True):
    q, k, v, beta, g, h0 = xs
    o, ht = triton_chunk_delta_rule(q, k, v, beta, g, initial_state=h0, output_final_state=output_final_state)
    ref = [None if x is None else x.detach().double().requires_grad_() for x in xs]
    o_ref, ht_ref = naive_delta_rule(*ref[:5], initial_state=ref[5], output_final_state=output_final_state)
    return (o, ht), (o_ref, ht_ref), ref


def forward_without_grad(xs):
    """The op under no_grad (no backward will follow), with the final state."""
    q, k, v, beta, g, h0 = (None if x is None else x.detach() for x in xs)
    with torch.no_grad():
        return triton_chunk_delta_rule(q, k, v, beta, g, initial_state=h0, output_final_state=True)


def check_forward_without_grad(xs, dtype, seed, reference=None):
    """`forward_without_grad` against the float64 token loop (or `reference`): o and the final
    state within the dtype's output bound."""
    o, ht = forward_without_grad(xs)
    ref = [None if x is None else x.detach().double() for x in xs]
    o_ref, ht_ref = (reference or naive_delta_rule)(*ref[:5], initial_state=ref[5], output_final_state=True)
    tol_out = TOLERANCE[dtype][0]
    assert rel_err(o, o_ref) < tol_out, f"o: {rel_err(o, o_ref):.2e} (seed {seed})"
    assert rel_err(ht, ht_ref) < tol_out, f"final state: {rel_err(ht, ht_ref):.2e} (seed {seed})"


def check_grouped_heads_without_grad(T):
    """The hierarchical DeltaNet's two states per head of q, k, v (grouped heads, bf16) under
    no_grad against the token loop on repeated heads."""
    B, HQ, D, groups = 2, 3, 32, 2
    seed = case_seed()
    q, k, v, beta, g, h0 = make_inputs(B, T, HQ * groups, D, D, "strong", True, torch.bfloat16, seed)
    xs = [x.detach()[:, :, :HQ] for x in (q, k, v)] + [beta, g, h0]
    check_forward_without_grad(xs, torch.bfloat16, seed, reference=_repeated_heads(groups))


def check_against_token_loop(B, T, H, K, V, decay, with_h0, dtype):
    """One random case against the float64 token loop: o, the final state and every gradient."""
    seed = case_seed()
    tol_out, tol_grad = TOLERANCE[dtype]
    xs = make_inputs(B, T, H, K, V, decay, with_h0, dtype, seed)
    assert_matches_reference(triton_chunk_delta_rule, naive_delta_rule, xs,
                             ("q", "k", "v", "beta", "g", "initial_state"), seed, tol_out, tol_grad,
                             grad_bounds={"g": DG_HALF_BOUND} if dtype != torch.float32 else None)


def spy_on_launches(monkeypatch) -> list:
    """The names of the tuner's launches from here on, in order."""
    from ltm.kernels import tuning
    launched = []
    launch = tuning.launch
    monkeypatch.setattr(tuning, "launch", lambda name, *a, **kw: launched.append(name) or launch(name, *a, **kw))
    return launched


# bfloat16 runs on the CPU too: under the interpreter these kernels round to bfloat16 as the GPU
# does (`ltm.kernels.common.rounded`), and heads of 64 take the bf16-tile path
@pytest.mark.parametrize("dtype", DTYPES if ON_GPU else (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("B,T,H,K,V,decay,with_h0", CASES,
                         ids=[f"{case_id(*c[:5])}-{c[5]}-h0{int(c[6])}" for c in CASES])
def test_forward_and_gradients_match_the_token_loop(B, T, H, K, V, decay, with_h0, dtype):
    check_against_token_loop(B, T, H, K, V, decay, with_h0, dtype)


def test_without_final_state_and_with_scale():
    seed = case_seed()
    q, k, v, beta, g, h0 = make_inputs(1, 40, 2, 32, 32, "weak", True, torch.float32, seed)
    o, ht = triton_chunk_delta_rule(q, k, v, beta, g, scale=0.3, initial_state=h0)
    assert ht is None
    ref = [x.detach().double().requires_grad_() for x in (q, k, v, beta, g, h0)]
    o_ref, _ = naive_delta_rule(*ref[:5], scale=0.3, initial_state=ref[5])
    assert rel_err(o, o_ref) <= 1e-4, f"seed={seed}"
    o.sum().backward()
    o_ref.sum().backward()
    for name, x, x_ref in zip(("q", "k", "v", "beta", "g", "h0"), (q, k, v, beta, g, h0), ref):
        assert rel_err(x.grad, x_ref.grad) <= 1e-4, f"seed={seed}: d{name}"



@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_no_decay_equals_a_decay_of_zeros_bit_for_bit(dtype):
    # g None skips the decays' loads in the prep (USE_G off) and gives no dg; exp(0) = 1 exactly,
    # so the outputs and the other gradients are those of g = 0 (one sequence: g's switch is per call)
    xs = make_inputs(1, 2 * CHUNK + 9, 2, 32, 48, "none", True, dtype, case_seed())
    q, k, v, beta, _, h0 = xs
    zeros = torch.zeros(beta.shape, device=beta.device, requires_grad=True)
    results = []
    for g in (None, zeros):
        o, ht = triton_chunk_delta_rule(q, k, v, beta, g, initial_state=h0, output_final_state=True)
        grads = torch.autograd.grad((o.float().square().sum() + ht.sum()), (q, k, v, beta, h0))
        results.append((o, ht, *grads))
    for plain, zero in zip(*results):
        assert torch.equal(plain, zero)

def test_bad_inputs_raise_one_line_errors():
    q = torch.zeros(1, 4, 2, 32, device=DEVICE)
    beta = torch.zeros(1, 4, 2, device=DEVICE)
    with pytest.raises(ValueError, match=r"^k must be \[B, T, H, K\]"):
        triton_chunk_delta_rule(q, q[:, :3], q, beta)
    with pytest.raises(ValueError, match=r"^beta must be \[B, T, H\]"):
        triton_chunk_delta_rule(q, q, q, beta[:, :3])
    with pytest.raises(ValueError, match="^v must have the dtype of the first input"):
        triton_chunk_delta_rule(q, q, q.half(), beta)
    with pytest.raises(ValueError, match="head size must be in"):
        triton_chunk_delta_rule(q, q, torch.zeros(1, 4, 2, 256, device=DEVICE), beta)
    with pytest.raises(ValueError, match=r"^initial_state must be \[B, H, K, V\]"):
        triton_chunk_delta_rule(q, q, q, beta, initial_state=torch.zeros(1, 2, 32, 16, device=DEVICE))


def test_forward_substitution_inverse_matches_the_token_loop_too(monkeypatch):
    # the launcher's switch back to the slower inverse, kept so its cost can be re-measured
    from ltm.kernels.delta_rule import chunk as module
    monkeypatch.setattr(module, "INVERSE_BY_SQUARING", False)
    seed = case_seed()
    xs = make_inputs(1, 2 * CHUNK + 3, 2, 32, 32, "strong", True, torch.float32, seed)
    (o, ht), (o_ref, ht_ref), ref = run_both(xs)
    assert rel_err(o, o_ref) <= 1e-4 and rel_err(ht, ht_ref) <= 1e-4, f"seed={seed}"
    (o.sum() + ht.sum()).backward()
    (o_ref.sum() + ht_ref.sum()).backward()
    for name, x, x_ref in zip(("q", "k", "v", "beta", "g", "h0"), xs, ref):
        assert rel_err(x.grad, x_ref.grad) <= 1e-4, f"seed={seed}: d{name}"


# launch paths besides the defaults, forced on every kernel at once: the sequential kernels (and
# all others) on value blocks narrower or wider than the default 32; in the interpreter only BV
# changes what runs (warps and stages do not), so one run per value-block layout covers them.
# 16-wide sequential blocks take 4 stages, as on their lists: with 1 stage the forward's output
# came out 17-22% off in bfloat16 on an H100 (Triton 3.6), a launch no list holds
LAUNCH_PATHS = {
    "narrow": {"delta_rule.fwd": {"BV": 16, "num_stages": 4},
               "delta_rule.bwd_state": {"BV": 16, "num_stages": 4},
               "delta_rule.output": {"BV": 32}, "delta_rule.bwd_local": {"BV": 32},
               "delta_rule.bwd_chunk": {"BV": 32}},
    "wide": {"delta_rule.fwd": {"BV": 64}, "delta_rule.bwd_state": {"BV": 64},
             "delta_rule.output": {"BV": 64}, "delta_rule.bwd_local": {"BV": 64},
             "delta_rule.bwd_chunk": {"BV": 64}},
    # the chunk-parallel kernels on one 128-wide block: the whole head, its last 48 columns masked
    "whole_head": {"delta_rule.output": {"BV": 128}, "delta_rule.bwd_local": {"BV": 128},
                   "delta_rule.bwd_chunk": {"BV": 128}},
}


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("path", sorted(LAUNCH_PATHS))
def test_other_value_blocks_match_the_token_loop(monkeypatch, path, dtype):
    # odd B and H, V = 80 (no multiple of 16, 32 or 64: the last value block is masked) and T
    # two chunks and 7 tokens; the launch choices of every kernel are the forced ones
    from ltm.kernels import tuning
    forced = {name: {"num_warps": 4, "num_stages": 1, **meta} for name, meta in LAUNCH_PATHS[path].items()}
    monkeypatch.setattr(tuning, "FORCED", forced)
    launched = spy_on_launches(monkeypatch)
    check_against_token_loop(3, 2 * CHUNK + 7, 1, 64, 80, "strong", True, dtype)
    assert set(forced) <= set(launched)


# the backward's buffers in float32 or bfloat16 (`BWD_BUFFERS`; bfloat16 only with bf16 tiles,
# heads >= 64): every mix, including dh_local and dh as two buffers of different dtypes; one
# sequence of two heads (the buffers' dtypes are per call, not per sequence)
@pytest.mark.parametrize("choice", [("f32", "f32", "f32"), ("mid", "f32", "mid"), ("f32", "mid", "f32")],
                         ids=lambda c: "-".join(c))
def test_backward_buffer_dtypes_match_the_token_loop(monkeypatch, choice):
    from ltm.kernels.delta_rule import chunk as launcher
    monkeypatch.setattr(launcher, "BWD_BUFFERS", dict(zip(("dd", "dh_local", "dh"), choice)))
    check_against_token_loop(1, 2 * CHUNK + 7, 2, 64, 64, "weak", True, torch.bfloat16)


@pytest.mark.parametrize("K", (64, 128))
def test_prep_on_few_looping_programs_matches_the_token_loop(monkeypatch, K):
    # bf16 tiles take the prep on looping programs (`launch_choices._prep_persistent`); 3 programs
    # for 2 x 2 x 4 chunks, so each takes several chunks of several heads, the last one a tail
    # (program p takes jobs p, p + 3, ... of the 16: 4 chunks, prime to the 3 programs, give each
    # program every chunk position, the tail among them, over every head)
    from ltm.kernels.delta_rule import chunk as launcher
    monkeypatch.setattr(launcher.launch_choices, "PREP_PROGRAMS_PER_SM", 1)
    monkeypatch.setattr(launcher, "_sm_count", lambda device: 3)
    launched = spy_on_launches(monkeypatch)
    check_against_token_loop(2, 3 * CHUNK + 9, 2, K, 64, "strong", True, torch.bfloat16)
    assert "delta_rule.prep" in launched


def _listed_launches(kernel: str, B: int, T: int, H: int, K: int, dtype) -> list[dict]:
    """The configurations on `kernel`'s list for the shape's class on this device."""
    from ltm.kernels.common import dot_precision
    from ltm.kernels.delta_rule import chunk as launcher
    lists = {"prep": launcher._prep_configs, "fwd": launcher._sequential_configs,
             "output": launcher._parallel_configs, "bwd_local": launcher._bwd_local_configs,
             "bwd_state": launcher._sequential_configs, "bwd_chunk": launcher._bwd_chunk_configs,
             "fwd_overlapped": launcher.launch_choices._overlapped_configs}
    cls = launcher._shape_class(B, T, H, K, K, dot_precision(dtype, K), torch.device(DEVICE))
    return [{**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages} for c in lists[kernel](cls)]


# every configuration on every list, one kernel at a time, on the GPU, where warps and stages
# change the compiled code (the interpreter ignores them; the tuner may pick any of them): few
# programs (one sequence of two heads) and many (64 heads, where 64-wide blocks join the lists)
@pytest.mark.skipif(not ON_GPU, reason="warps and stages change nothing in the interpreter")
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("K", (64, 128))
@pytest.mark.parametrize("kernel", ("prep", "fwd", "output", "bwd_local", "bwd_state", "bwd_chunk"))
def test_every_listed_launch_matches_the_token_loop(monkeypatch, kernel, K, dtype):
    from ltm.kernels import tuning
    seed = case_seed()
    tol_out, tol_grad = TOLERANCE[dtype]
    failures = []
    for B, H in ((1, 2), (4, 16)):
        for choice in _listed_launches(kernel, B, 3 * CHUNK + 5, H, K, dtype):
            monkeypatch.setattr(tuning, "FORCED", {f"delta_rule.{kernel}": choice})
            xs = make_inputs(B, 3 * CHUNK + 5, H, K, K, "strong", True, dtype, seed)
            try:
                assert_matches_reference(triton_chunk_delta_rule, naive_delta_rule, xs,
                                         ("q", "k", "v", "beta", "g", "initial_state"), seed, tol_out,
                                         tol_grad, grad_bounds={"g": DG_HALF_BOUND} if dtype != torch.float32 else None)
            except AssertionError as err:
                failures.append(f"B{B} H{H} {choice}: {str(err).splitlines()[0]}")
    assert not failures, "\n".join(failures)


def _repeated_heads(groups: int):
    """The token loop on q, k, v repeated `groups` times along the heads: what grouped heads
    compute (its autograd sums each repeat's gradient back onto q, k, v)."""
    def reference(q, k, v, beta, g, initial_state=None, output_final_state=False):
        q, k, v = (torch.cat([x] * groups, dim=2) for x in (q, k, v))
        return naive_delta_rule(q, k, v, beta, g, initial_state=initial_state,
                                output_final_state=output_final_state)
    return reference


# (B, T, HQ, D, groups): the hierarchical DeltaNet's two states per head, odd sizes, T over two
# chunks and a partial one; three groups on a tail chunk only
GROUPED_CASES = [(2, 2 * CHUNK + 5, 3, 32, 2), (1, 37, 2, 64, 3)]


@pytest.mark.parametrize("dtype", DTYPES if ON_GPU else (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("B,T,HQ,D,groups", GROUPED_CASES,
                         ids=[f"{case_id(*c[:3], c[3], c[3])}-G{c[4]}" for c in GROUPED_CASES])
def test_grouped_heads_match_the_token_loop_on_repeated_heads(B, T, HQ, D, groups, dtype):
    seed = case_seed()
    tol_out, tol_grad = TOLERANCE[dtype]
    q, k, v, beta, g, h0 = make_inputs(B, T, HQ * groups, D, D, "strong", True, dtype, seed)
    xs = [x.detach()[:, :, :HQ].clone().requires_grad_() for x in (q, k, v)] + [beta, g, h0]
    assert_matches_reference(triton_chunk_delta_rule, _repeated_heads(groups), xs,
                             ("q", "k", "v", "beta", "g", "initial_state"), seed, tol_out, tol_grad,
                             grad_bounds={"g": DG_HALF_BOUND} if dtype != torch.float32 else None)


def test_grouped_heads_by_warmups_match_the_token_loop(monkeypatch):
    # both state passes by warm-ups in segments of 3 and 2 chunks ("medium" decay: three chunks
    # each), two states per head of q, k, v, against the float64 loop on the repeated heads
    from ltm.kernels.delta_rule import segment_choices
    monkeypatch.setattr(segment_choices, "MIN_WARMUP_CHUNKS", 2)
    launched = spy_on_launches(monkeypatch)
    seed = case_seed()
    q, k, v, beta, g, h0 = make_inputs(1, 4 * CHUNK + 9, 4, 32, 32, "medium", True, torch.float32, seed)
    xs = [x.detach()[:, :, :2].clone().requires_grad_() for x in (q, k, v)] + [beta, g, h0]
    assert_matches_reference(triton_chunk_delta_rule, _repeated_heads(2), xs,
                             ("q", "k", "v", "beta", "g", "initial_state"), seed, *TOLERANCE[torch.float32])
    assert {"delta_rule.fwd_warmup", "delta_rule.bwd_warmup"} <= set(launched)


def test_grouped_heads_equal_the_stacked_copies_in_float32():
    # same kernels, same order of operations: the forward to the bit, the gradients to rounding
    # (each repeat's dq, dk, dv summed in float32 in both)
    seed = case_seed()
    q, k, v, beta, g, h0 = make_inputs(2, CHUNK + 9, 4, 32, 32, "weak", True, torch.float32, seed)
    xs = [x.detach()[:, :, :2].clone().requires_grad_() for x in (q, k, v)]
    stacked = [torch.cat([x, x], dim=2).detach().requires_grad_() for x in xs]
    o, ht = triton_chunk_delta_rule(*xs, beta, g, initial_state=h0, output_final_state=True)
    o_s, ht_s = triton_chunk_delta_rule(*stacked, beta, g, initial_state=h0, output_final_state=True)
    assert torch.equal(o, o_s) and torch.equal(ht, ht_s), f"seed={seed}"
    o.sum().backward()
    o_s.sum().backward()
    for name, x, x_s in zip("qkv", xs, stacked):
        assert rel_err(x.grad, x_s.grad[:, :, :2] + x_s.grad[:, :, 2:]) <= 1e-6, f"seed={seed}: d{name}"


def test_grouped_heads_need_a_multiple_of_the_heads():
    q = torch.zeros(1, 4, 2, 32, device=DEVICE)
    with pytest.raises(ValueError, match=r"^beta must be \[B, T, H\] = \(1, 4, 2\) or \[B, T, G \* 2\]"):
        triton_chunk_delta_rule(q, q, q, torch.zeros(1, 4, 3, device=DEVICE))
    with pytest.raises(ValueError, match=r"^g must be \[B, T, H\] = \(1, 4, 4\) like beta"):
        triton_chunk_delta_rule(q, q, q, torch.zeros(1, 4, 4, device=DEVICE),
                                torch.zeros(1, 4, 2, device=DEVICE))


# the gated state passes by warm-ups (`segment_choices.WARMUP_FORWARD`, `WARMUP_BACKWARD`), in
# segments of at least two chunks: 7 chunks in segments of 3, 3 and 1, 4 in two of 2. "strong"
# decay warms up over one chunk, "medium" (-8 a chunk) over two (bf16 tiles, floor -10) or three
# (float32, -17; from the initial state at chunk 0 for the second segment), except in segments of
# 2 at float32 (-16 each: the head goes exact in one program), as "weak" does everywhere
WARMUP_CASES = [(1, 6 * CHUNK + 5, 2, 64, 64, decay, True) for decay in ("strong", "medium", "weak")]
WARMUP_CASES += [(2, 3 * CHUNK + 1, 1, 32, 48, "medium", False), (1, 6 * CHUNK + 5, 2, 64, 64, "mixed", True)]


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("B,T,H,K,V,decay,with_h0", WARMUP_CASES,
                         ids=[f"{case_id(*c[:5])}-{c[5]}-h0{int(c[6])}" for c in WARMUP_CASES])
def test_state_passes_by_warmups_match_the_token_loop(monkeypatch, B, T, H, K, V, decay, with_h0,
                                                     dtype):
    from ltm.kernels.delta_rule import segment_choices
    for switch in ("WARMUP_FORWARD", "WARMUP_BACKWARD"):
        monkeypatch.setattr(segment_choices, switch, True)
    monkeypatch.setattr(segment_choices, "MIN_WARMUP_CHUNKS", 2)
    launched = spy_on_launches(monkeypatch)
    check_against_token_loop(B, T, H, K, V, decay, with_h0, dtype)
    assert {"delta_rule.fwd_warmup", "delta_rule.bwd_warmup"} <= set(launched)
    assert not {"delta_rule.fwd", "delta_rule.bwd_state"} & set(launched)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("decay", ("mixed", "weak"))
def test_warmups_with_the_exact_heads_apart_match_the_token_loop(monkeypatch, decay, dtype):
    # the warm-up launch for the heads that decay to the floor, a second launch for the rest
    # (`segment_choices._warmup_splits_heads`, forced here): "mixed" has one head of each kind at
    # bf16 tiles, "weak" only exact ones; each launch must leave the other's heads alone
    from ltm.kernels.delta_rule import segment_choices
    for switch in ("WARMUP_FORWARD", "WARMUP_BACKWARD"):
        monkeypatch.setattr(segment_choices, switch, True)
    monkeypatch.setattr(segment_choices, "MIN_WARMUP_CHUNKS", 2)
    monkeypatch.setattr(segment_choices, "_warmup_splits_heads", lambda cls, backward=False: True)
    launched = spy_on_launches(monkeypatch)
    check_against_token_loop(1, 6 * CHUNK + 5, 2, 64, 64, decay, True, dtype)
    assert {"delta_rule.fwd_warmup", "delta_rule.fwd_warmup_exact", "delta_rule.bwd_warmup",
            "delta_rule.bwd_warmup_exact"} <= set(launched)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_the_backwards_warmups_alone_after_a_one_segment_forward_match_the_token_loop(monkeypatch, dtype):
    # where the forward's narrow programs fill the SMs its warm-ups stay narrow and do not split,
    # while the backward's go wide, exact heads apart (`segment_choices._warmup_configs`): the
    # backward then reads the one-segment forward's states
    from ltm.kernels.delta_rule import segment_choices
    monkeypatch.setattr(segment_choices, "WARMUP_FORWARD", False)
    monkeypatch.setattr(segment_choices, "WARMUP_BACKWARD", True)
    monkeypatch.setattr(segment_choices, "MIN_WARMUP_CHUNKS", 2)
    monkeypatch.setattr(segment_choices, "_warmup_splits_heads",
                        lambda cls, backward=False: backward)
    launched = spy_on_launches(monkeypatch)
    check_against_token_loop(1, 6 * CHUNK + 5, 2, 64, 64, "mixed", True, dtype)
    assert {"delta_rule.fwd", "delta_rule.bwd_warmup", "delta_rule.bwd_warmup_exact"} <= set(launched)
    assert not {"delta_rule.fwd_warmup", "delta_rule.fwd_warmup_exact"} & set(launched)


def test_warmups_cut_the_past_at_the_floor(monkeypatch):
    # a floor of -2 (a decay of 0.14) lets "weak" decay (about -1.6 a chunk) warm up from two
    # chunks (segments of 3: the second from chunk 1): the outputs then differ from the exact
    # pass's beyond float32 rounding, by less than the floor allows; ungated calls never warm up
    # (nothing decays: each segment would redo the whole prefix)
    from ltm.kernels.delta_rule import segment_choices
    seed = case_seed()
    q, k, v, beta, g, h0 = make_inputs(1, 4 * CHUNK + 3, 2, 32, 32, "weak", True, torch.float32, seed)
    exact, _ = triton_chunk_delta_rule(q, k, v, beta, g, initial_state=h0, warmup=False)
    monkeypatch.setattr(segment_choices, "WARMUP_LOG_FLOOR",
                        dict.fromkeys(segment_choices.WARMUP_LOG_FLOOR, -2.))
    cut, _ = triton_chunk_delta_rule(q, k, v, beta, g, initial_state=h0, warmup=True, segments=(2, 8))
    assert 1e-4 < rel_err(cut, exact) < 0.2, f"seed={seed}"
    # in segments of one chunk each decays by less than the floor: the head goes exact
    whole, _ = triton_chunk_delta_rule(q, k, v, beta, g, initial_state=h0, warmup=True, segments=(1, 8))
    assert rel_err(whole, exact) < 1e-6, f"seed={seed}"
    launched = spy_on_launches(monkeypatch)
    triton_chunk_delta_rule(q, k, v, beta, None, initial_state=h0, warmup=True, segments=(1, 8))
    assert "delta_rule.fwd_warmup" not in launched


# the state passes by segments (`segment_choices.SEGMENTED_FORWARD`, `SEGMENTED_BACKWARD`), one
# pass at a time, forced on with short segments: 7 chunks in segments of 3, 3 and 1 (the last
# chunk masked), and 4 in segments of 2; every output and gradient against float64
SEGMENT_CASES = [(1, 6 * CHUNK + 5, 2, 64, 64, "strong", True), (2, 3 * CHUNK + 1, 1, 32, 48, "weak", False)]
SEGMENTED_PASSES = {"forward": ("SEGMENTED_FORWARD", "delta_rule.fwd_segment_states"),
                    "backward": ("SEGMENTED_BACKWARD", "delta_rule.bwd_segment_states")}


@pytest.mark.parametrize("segmented", sorted(SEGMENTED_PASSES))
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("B,T,H,K,V,decay,with_h0", SEGMENT_CASES,
                         ids=[f"{case_id(*c[:5])}-{c[5]}-h0{int(c[6])}" for c in SEGMENT_CASES])
def test_segmented_passes_match_the_token_loop(monkeypatch, B, T, H, K, V, decay, with_h0, dtype,
                                               segmented):
    from ltm.kernels.delta_rule import segment_choices
    switch, combine = SEGMENTED_PASSES[segmented]
    monkeypatch.setattr(segment_choices, switch, True)
    monkeypatch.setattr(segment_choices, "MIN_SEGMENT_CHUNKS", 2)
    launched = spy_on_launches(monkeypatch)
    check_against_token_loop(B, T, H, K, V, decay, with_h0, dtype)
    combines = {name for _, name in SEGMENTED_PASSES.values()}
    assert combines & set(launched) == {combine}
