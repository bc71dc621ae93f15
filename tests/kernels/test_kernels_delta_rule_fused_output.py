"""The delta rule's forward with the outputs fused into the state pass (`launch_choices._fuses_output`
chooses it; forced on here at every shape): without a backward (no L^-1, no per-chunk states) and
in training, against the float64 token loop; the launches it makes."""
import pytest
import torch

from ltm.kernels import tuning
from ltm.kernels.delta_rule import chunk, launch_choices, triton_chunk_delta_rule
from ltm.kernels.delta_rule.chunk import CHUNK
from reference import ON_GPU, case_id, case_seed, rel_err
from test_kernels_delta_rule import (check_against_token_loop, check_forward_without_grad,
                                     check_grouped_heads_without_grad, forward_without_grad, make_inputs,
                                     spy_on_launches)

# (B, T, H, K, V, decay, initial state): one token, a tail chunk, K != V both ways, several chunks
# with a masked last one
CASES = [
    (1, 1, 1, 32, 32, "weak", True),
    (2, 37, 3, 32, 48, "none", False),
    (1, 2 * CHUNK + 3, 2, 48, 32, "strong", True),
    (2, 3 * CHUNK, 1, 64, 64, "weak", False),
]
if ON_GPU:
    CASES += [(2, 300, 4, 128, 128, "weak", True), (1, 1000, 2, 64, 128, "strong", True),
              (1, 70, 2, 128, 16, "none", True), (3, 200, 2, 128, 64, "strong", False)]
IDS = [f"{case_id(*c[:5])}-{c[5]}-h0{int(c[6])}" for c in CASES]


def spy_on_launch_args(monkeypatch) -> dict:
    """Each tuner launch's arguments by launch name (the last of each name), from here on."""
    args_of = {}
    launch = tuning.launch

    def spy(name, kernel, grid, configs, cls, args, **kw):
        args_of[name] = args
        return launch(name, kernel, grid, configs, cls, args, **kw)
    monkeypatch.setattr(tuning, "launch", spy)
    return args_of


@pytest.fixture
def fused(monkeypatch):
    """The fused state pass forced on: `fused(training=...)`."""
    def force(training: bool = False):
        monkeypatch.setattr(launch_choices, "_fuses_output", lambda cls, backward: training or not backward)
    return force


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("B,T,H,K,V,decay,with_h0", CASES, ids=IDS)
def test_forward_without_backward_matches_the_token_loop(monkeypatch, fused, B, T, H, K, V, decay,
                                                         with_h0, dtype):
    fused()
    seed = case_seed()
    xs = make_inputs(B, T, H, K, V, decay, with_h0, dtype, seed)
    launched = spy_on_launches(monkeypatch)
    check_forward_without_grad(xs, dtype, seed)
    # the state pass wrote the outputs: no output kernel ran (by warm-ups where the call splits
    # into segments: a few-program shape on a GPU)
    assert launched in (["delta_rule.prep", "delta_rule.fwd_output"],
                        ["delta_rule.prep", "delta_rule.fwd_warmup_output"])


def test_forward_without_backward_on_grouped_heads(fused):
    fused()
    check_grouped_heads_without_grad(2 * CHUNK + 5)


def test_forward_with_a_backward_keeps_the_output_kernel(monkeypatch, fused):
    fused()
    xs = make_inputs(1, CHUNK + 9, 2, 32, 32, "weak", True, torch.float32, case_seed())
    launched = spy_on_launches(monkeypatch)
    triton_chunk_delta_rule(*xs[:5], initial_state=xs[5])
    assert "delta_rule.output" in launched and "delta_rule.fwd_output" not in launched


def test_fused_forward_differs_from_the_two_pass_one_by_rounding_only(fused):
    fused()
    # float32 tiles: the same products in another order, so far below the token loop's bound
    xs = make_inputs(2, 2 * CHUNK + 11, 2, 48, 40, "strong", True, torch.float32, case_seed())
    o_fused, ht_fused = forward_without_grad(xs)
    o, ht = triton_chunk_delta_rule(*xs[:5], initial_state=xs[5], output_final_state=True)
    assert rel_err(o_fused, o.detach()) < 1e-5 and rel_err(ht_fused, ht.detach()) < 1e-6


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("B,T,H,K,V,decay,with_h0", CASES[1:3], ids=IDS[1:3])
def test_fused_output_in_training_matches_the_token_loop(monkeypatch, fused, B, T, H, K, V, decay,
                                                         with_h0, dtype):
    # the per-chunk states and D stored for the backward as well, every gradient checked
    fused(training=True)
    launched = spy_on_launches(monkeypatch)
    check_against_token_loop(B, T, H, K, V, decay, with_h0, dtype)
    assert "delta_rule.fwd_output" in launched and "delta_rule.output" not in launched


@pytest.mark.skipif(not ON_GPU, reason="torch.compile traces the Triton launches on a GPU only")
@pytest.mark.parametrize("B,T,H", [(8, 300, 16), (1, 300, 2)], ids=["many-programs", "few-programs"])
def test_forward_without_backward_under_torch_compile(B, T, H):
    # the model's evaluation path: compiled, no_grad; the fused pass at many programs (the
    # launcher's own rule), the two-pass one at few; against the eager op, bf16
    xs = [x.detach() for x in make_inputs(B, T, H, 128, 128, "weak", True, torch.bfloat16, case_seed())]

    def op(q, k, v, beta, g, h0):
        return triton_chunk_delta_rule(q, k, v, beta, g, initial_state=h0, output_final_state=True)
    with torch.no_grad():
        o_eager, ht_eager = op(*xs)
        o, ht = torch.compile(op, fullgraph=True)(*xs)
    assert rel_err(o, o_eager) < 1e-3 and rel_err(ht, ht_eager) < 1e-4


@pytest.mark.parametrize("from_linv", (True, False), ids=("from_linv", "from_w_u"))
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_the_fused_forward_makes_d_from_linv_and_writes_no_w_or_u(monkeypatch, fused, from_linv,
                                                                  dtype):
    # FORWARD_FROM_LINV: the prep writes L^-1 and neither W nor U, the state pass makes D from
    # L^-1, keys, values and betas; off, the two-tensor path as before. Both against the token
    # loop, on a masked last chunk, odd widths and an initial state
    fused()
    # (the default, "fused", against "never")
    monkeypatch.setattr(chunk, "FORWARD_FROM_LINV", "fused" if from_linv else "never")
    args_of = spy_on_launch_args(monkeypatch)
    seed = case_seed()
    xs = make_inputs(2, 2 * CHUNK + 7, 3, 48, 40, "strong", True, dtype, seed)
    check_forward_without_grad(xs, dtype, seed)
    prep, state_pass = args_of["delta_rule.prep"], args_of["delta_rule.fwd_output"]
    assert prep["STORE_WU"] is not from_linv and (prep["w"] is None) is from_linv
    assert prep["STORE_LINV"] is from_linv  # (no backward: L^-1 only for the pass)
    assert state_pass.get("FROM_LINV", False) is from_linv


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("decay", ("mixed", "medium"))
def test_the_fused_forward_by_warmups_makes_d_from_linv(monkeypatch, fused, decay, dtype):
    # the warm-ups' own chunks make D from L^-1 as the pass does: segments of 2 chunks, "medium"
    # decaying to the floor in a few chunks, "mixed" with a head that never does (exact from h0)
    from ltm.kernels.delta_rule import segment_choices
    fused()
    monkeypatch.setattr(segment_choices, "WARMUP_FORWARD", True)
    monkeypatch.setattr(segment_choices, "MIN_WARMUP_CHUNKS", 2)
    args_of = spy_on_launch_args(monkeypatch)
    seed = case_seed()
    xs = make_inputs(1, 6 * CHUNK + 5, 2, 64, 48, decay, True, dtype, seed)
    check_forward_without_grad(xs, dtype, seed)
    assert list(args_of) == ["delta_rule.prep", "delta_rule.fwd_warmup_output"]
    assert args_of["delta_rule.fwd_warmup_output"]["FROM_LINV"] is True
    assert args_of["delta_rule.prep"]["w"] is None
    # against the W and U warm-ups: the same state cut at the same chunks, rounding apart
    o, ht = forward_without_grad(xs)
    monkeypatch.setattr(chunk, "FORWARD_FROM_LINV", "never")
    o_wu, ht_wu = forward_without_grad(xs)
    assert args_of["delta_rule.fwd_warmup_output"]["FROM_LINV"] is False
    bound = 1e-5 if dtype == torch.float32 else 1e-2
    assert rel_err(o, o_wu) < bound and rel_err(ht, ht_wu) < bound, f"seed={seed}"


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_the_inference_forward_with_its_output_kernel_makes_d_from_linv(monkeypatch, dtype):
    # outputs not fused (few programs), FORWARD_FROM_LINV "always": the one-segment pass stores
    # the states and D, made from L^-1, for the output kernel; the overlapped launch and the exact
    # segments keep W and U. The default ("fused") keeps W and U here
    monkeypatch.setattr(launch_choices, "_fuses_output", lambda cls, backward: False)
    args_of = spy_on_launch_args(monkeypatch)
    seed = case_seed()
    xs = make_inputs(2, 2 * CHUNK + 7, 3, 48, 40, "strong", True, dtype, seed)
    check_forward_without_grad(xs, dtype, seed)
    assert args_of["delta_rule.prep"]["STORE_WU"] and not args_of["delta_rule.fwd"]["FROM_LINV"]
    monkeypatch.setattr(chunk, "FORWARD_FROM_LINV", "always")
    args_of.clear()
    check_forward_without_grad(xs, dtype, seed)
    assert list(args_of) == ["delta_rule.prep", "delta_rule.fwd", "delta_rule.output"]
    assert args_of["delta_rule.prep"]["w"] is None and args_of["delta_rule.fwd"]["FROM_LINV"]
    q, k, v, beta, g, h0 = (x.detach() for x in xs)
    for options in ({"overlap_output": "inference"}, {"segments": (1, 8)}):
        args_of.clear()
        with torch.no_grad():
            o, _ = triton_chunk_delta_rule(q, k, v, beta, g, initial_state=h0, warmup=False,
                                           **options)
        assert args_of["delta_rule.prep"]["STORE_WU"] is True, options
        assert torch.isfinite(o).all(), options


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_the_inference_warmups_with_the_exact_heads_apart_make_d_from_linv(monkeypatch, dtype):
    # outputs not fused, warm-ups with the heads that never decay in a launch of their own,
    # FORWARD_FROM_LINV "always": both launches make D from L^-1 ("mixed": one head of each kind)
    from ltm.kernels.delta_rule import segment_choices
    monkeypatch.setattr(chunk, "FORWARD_FROM_LINV", "always")
    monkeypatch.setattr(launch_choices, "_fuses_output", lambda cls, backward: False)
    monkeypatch.setattr(segment_choices, "WARMUP_FORWARD", True)
    monkeypatch.setattr(segment_choices, "MIN_WARMUP_CHUNKS", 2)
    monkeypatch.setattr(segment_choices, "_warmup_splits_heads", lambda cls, backward=False: True)
    args_of = spy_on_launch_args(monkeypatch)
    seed = case_seed()
    check_forward_without_grad(make_inputs(1, 6 * CHUNK + 5, 2, 64, 64, "mixed", True, dtype, seed),
                               dtype, seed)
    assert args_of["delta_rule.prep"]["w"] is None
    assert args_of["delta_rule.fwd_warmup"]["FROM_LINV"]
    assert args_of["delta_rule.fwd_warmup_exact"]["FROM_LINV"]
