"""The delta rule's forward with the state pass and the outputs in one launch
(`_fwd_overlapped_kernel`; `segment_choices._overlaps_output` chooses it, forced on here at every
shape of two chunks or more): without and with a backward against the float64 token loop, its
launch variants against the two-launch forward, the launches it makes. Under the interpreter the
programs run one after another, so the waits never wait; on a GPU the same tests run them
concurrently, and the large-shape test compares bit for bit with the two-launch forward."""
import pytest
import torch

from ltm.kernels import tuning
from ltm.kernels.delta_rule import launch_choices, segment_choices, triton_chunk_delta_rule
from ltm.kernels.delta_rule.chunk import CHUNK
from reference import ON_GPU, case_id, case_seed, rel_err
from test_kernels_delta_rule import (_listed_launches, check_against_token_loop, check_forward_without_grad,
                                     check_grouped_heads_without_grad, forward_without_grad, make_inputs,
                                     spy_on_launches)

# (B, T, H, K, V, decay, initial state): a tail chunk, K != V both ways, 6 chunks (a last group of
# releases shorter than the others), chunks an exact multiple
CASES = [
    (1, 2 * CHUNK + 3, 2, 48, 32, "strong", True),
    (2, 5 * CHUNK + 1, 1, 32, 48, "weak", False),
    (2, 3 * CHUNK, 3, 64, 64, "none", True),
]
if ON_GPU:
    CASES += [(2, 300, 4, 128, 128, "weak", True), (1, 1000, 2, 64, 128, "strong", True),
              (1, 70, 2, 128, 16, "none", True), (3, 2000, 2, 128, 64, "strong", False)]
IDS = [f"{case_id(*c[:5])}-{c[5]}-h0{int(c[6])}" for c in CASES]


@pytest.fixture(autouse=True)
def exact_state_pass(monkeypatch):
    """The gated forward's segments by warm-ups off (test_kernels_delta_rule.py checks them): the
    overlapped forward is compared with the one-pass forward, bit for bit where both run."""
    monkeypatch.setattr(segment_choices, "WARMUP_FORWARD", False)


@pytest.fixture
def overlapped(monkeypatch):
    """The overlapped forward forced on (two chunks or more), for both kinds of forward."""
    monkeypatch.setattr(segment_choices, "_overlaps_output", lambda cls, NT, backward=True: NT > 1)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("B,T,H,K,V,decay,with_h0", CASES, ids=IDS)
def test_forward_without_backward_matches_the_token_loop(monkeypatch, overlapped, B, T, H, K, V,
                                                         decay, with_h0, dtype):
    seed = case_seed()
    xs = make_inputs(B, T, H, K, V, decay, with_h0, dtype, seed)
    launched = spy_on_launches(monkeypatch)
    check_forward_without_grad(xs, dtype, seed)
    assert launched == ["delta_rule.prep", "delta_rule.fwd_overlapped"]


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("B,T,H,K,V,decay,with_h0", CASES[:2], ids=IDS[:2])
def test_training_forward_matches_the_token_loop(monkeypatch, overlapped, B, T, H, K, V, decay,
                                                 with_h0, dtype):
    # the per-chunk states and D it stores feed the backward: every gradient checked
    launched = spy_on_launches(monkeypatch)
    check_against_token_loop(B, T, H, K, V, decay, with_h0, dtype)
    assert "delta_rule.fwd_overlapped" in launched
    assert "delta_rule.fwd" not in launched and "delta_rule.output" not in launched


def test_grouped_heads(overlapped):
    check_grouped_heads_without_grad(3 * CHUNK + 5)



def test_counts_zeroed_by_the_prep_on_one_program(monkeypatch, overlapped):
    # the prep zeroes the overlapped launch's counters (ZERO_READY; under the tests they start at
    # -1): on one looping program of bf16 tiles, with a release every chunk, 1 + 2 x 3 x 22 = 133
    # counters in two strides of 128, so a count left unzeroed past the first stride would mistake
    # the programs' roles or never reach its target
    from ltm.kernels.delta_rule import chunk as launcher
    monkeypatch.setattr(launch_choices, "PREP_PROGRAMS_PER_SM", 1)
    monkeypatch.setattr(launcher, "_sm_count", lambda device: 1)
    monkeypatch.setattr(tuning, "FORCED", {"delta_rule.fwd_overlapped": {
        "BV": 16, "BVO": 16, "EVERY": 1, "LANES": 128, "num_warps": 4, "num_stages": 3}})
    seed = case_seed()
    launched = spy_on_launches(monkeypatch)
    check_forward_without_grad(make_inputs(2, 21 * CHUNK + 7, 3, 32, 16, "weak", True, torch.bfloat16,
                                           seed), torch.bfloat16, seed)
    assert launched == ["delta_rule.prep", "delta_rule.fwd_overlapped"]

# launch variants: the state pass's value block, the outputs' value block, releases every chunk,
# every 4 (6 chunks: groups of 4 and 2) and every 16 (one group short of the pass)
VARIANTS = [dict(BV=16, BVO=32, EVERY=1), dict(BV=32, BVO=64, EVERY=4), dict(BV=64, BVO=128, EVERY=16)]


@pytest.fixture(scope="module")
def two_launch_forward():
    """The launch variants' inputs and their two-launch forward (the launcher's own choice at this
    shape), once for the module: every variant compares with the same one."""
    xs = make_inputs(2, 5 * CHUNK + 7, 2, 48, 80, "strong", True, torch.float32, case_seed())
    with pytest.MonkeyPatch.context() as mp:
        launched = spy_on_launches(mp)
        two = forward_without_grad(xs)
    assert "delta_rule.fwd_overlapped" not in launched
    return xs, two


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{k}{x}" for k, x in v.items()))
def test_launch_variants_equal_the_two_launch_forward(monkeypatch, two_launch_forward, variant):
    # float32 tiles: the same products in the same order as `_fwd_kernel` then `_output_kernel`
    xs, (o_two, ht_two) = two_launch_forward
    monkeypatch.setattr(segment_choices, "_overlaps_output", lambda cls, NT, backward=True: True)
    monkeypatch.setattr(tuning, "FORCED", {"delta_rule.fwd_overlapped": {
        **variant, "LANES": 128, "num_warps": 4, "num_stages": 3}})
    launched = spy_on_launches(monkeypatch)
    o, ht = forward_without_grad(xs)
    assert "delta_rule.fwd_overlapped" in launched
    assert rel_err(o, o_two) < 1e-6 and rel_err(ht, ht_two) < 1e-6


# every configuration on the list, on the GPU, where warps and stages change the compiled code
# (the tuner may pick any of them): few programs (one sequence of two heads), where 16-wide value
# blocks come first, and many (two sequences of 16 heads)
@pytest.mark.skipif(not ON_GPU, reason="warps and stages change nothing in the interpreter")
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("K", (64, 128))
def test_every_listed_launch_matches_the_token_loop(monkeypatch, overlapped, K, dtype):
    seed = case_seed()
    failures = []
    for B, H in ((1, 2), (2, 16)):
        choices = _listed_launches("fwd_overlapped", B, 3 * CHUNK + 5, H, K, dtype)
        assert {c["EVERY"] for c in choices} == {4, 16}
        for choice in choices:
            monkeypatch.setattr(tuning, "FORCED", {"delta_rule.fwd_overlapped": choice})
            xs = make_inputs(B, 3 * CHUNK + 5, H, K, K, "strong", True, dtype, seed)
            try:
                check_forward_without_grad(xs, dtype, seed)
            except AssertionError as err:
                failures.append(f"B{B} H{H} {choice}: {str(err).splitlines()[0]}")
    assert not failures, "\n".join(failures)


@pytest.mark.skipif(not ON_GPU, reason="the programs run concurrently on a GPU only")
@pytest.mark.parametrize("backward", (False, True), ids=("inference", "training"))
def test_large_shape_equals_the_two_launch_forward_bit_for_bit(monkeypatch, backward):
    # 64 programs of 32 columns and 128 chunks, bf16, as the launcher's own rule takes it: output
    # programs that read a chunk before its states are stored would differ here
    xs = make_inputs(2, 8192, 8, 128, 128, "weak", True, torch.bfloat16, case_seed())
    xs = [x.detach().requires_grad_(backward) for x in xs]

    def forward():
        with torch.set_grad_enabled(backward):
            return triton_chunk_delta_rule(*xs[:5], initial_state=xs[5], output_final_state=True)
    launched = spy_on_launches(monkeypatch)
    o, ht = forward()
    assert "delta_rule.fwd_overlapped" in launched
    monkeypatch.setattr(segment_choices, "_overlaps_output", lambda cls, NT, backward=True: False)
    o_two, ht_two = forward()
    assert torch.equal(o, o_two) and torch.equal(ht, ht_two)


@pytest.mark.skipif(not ON_GPU, reason="torch.compile traces the Triton launches on a GPU only")
@pytest.mark.parametrize("backward", (False, True), ids=("inference", "training"))
def test_under_torch_compile(monkeypatch, backward):
    # a layer's call compiled whole, at a shape the launcher's own rule overlaps (64 programs of 32
    # columns): the start tickets and counts live in a buffer the kernel's atomics update, which
    # the compiled graph must allocate and zero on every call; against the eager op, bf16
    xs = make_inputs(2, 1000, 8, 128, 128, "weak", True, torch.bfloat16, case_seed())
    xs = [x.detach().requires_grad_(backward) for x in xs]
    do = torch.randn(2, 1000, 8, 128, device=xs[0].device, dtype=torch.bfloat16)

    def op(q, k, v, beta, g, h0):
        return triton_chunk_delta_rule(q, k, v, beta, g, initial_state=h0, output_final_state=True)

    def loss(o, ht):
        return (o.float() * do).sum() + ht.sum()
    launched = spy_on_launches(monkeypatch)
    with torch.set_grad_enabled(backward):
        eager = op(*xs)
        grads = torch.autograd.grad(loss(*eager), xs) if backward else ()
    assert "delta_rule.fwd_overlapped" in launched
    monkeypatch.undo()  # the spy's list, appended to inside the autograd.Function, stops dynamo
    with torch.set_grad_enabled(backward):
        compiled = torch.compile(op, fullgraph=True)
        for _ in range(2):  # the second call reuses the graph: the counts must start from zero again
            o, ht = compiled(*xs)
            # the outputs, not a sum of them: the compiled kernel's bf16 outputs differ from the
            # eager one's by one unit in the last place at a few elements (99 of 2,048,000, H100,
            # Triton 3.6: Inductor compiles the kernel itself), and a sum of o * do cancels to
            # ~1e-3 of its terms' magnitudes, which made that a 4.5e-4 relative difference
            assert rel_err(o, eager[0]) < 1e-4 and rel_err(ht, eager[1]) < 1e-4
        if backward:
            for grad, ref in zip(torch.autograd.grad(loss(o, ht), xs), grads):
                assert rel_err(grad, ref) < 1e-3
