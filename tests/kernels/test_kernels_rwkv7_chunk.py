"""The chunked Triton RWKV-7 recurrence against the float64 token loop, forward and every gradient."""
import pytest
import torch
import torch.nn.functional as F

from reference import (DEVICE, DTYPES, ON_GPU, TOLERANCE, assert_matches_reference,
                       assert_matches_reference_without_final_state, case_id, case_seed,
                       rel_err)
from ltm.kernels.rwkv7 import chunk as rwkv7_chunk, triton_chunk_rwkv7
from ltm.kernels.rwkv7.chunk import CHUNK, FAST_SPAN
from ltm.ops.rwkv7.naive import naive_rwkv7

# (B, T, H, K, V, decay, initial state): T = 1, T < chunk, T = chunk, odd T over several chunks
# with a masked tail, K != V both ways, sizes that are no power of two or below the 32-wide value
# blocks; decay "weak" (w in [-0.05, 0]: every chunk takes the
# tensor-core path), "strong" (w in [-10, 0] per token and channel, in-chunk decays down to
# exp(-150): the exact column loops) or "mixed" (strong in the second chunk only: both paths)
CASES = [
    (1, 1, 1, 32, 32, "weak", True),
    (1, 11, 2, 32, 32, "strong", False),
    (1, CHUNK, 1, 64, 64, "weak", True),
    (2, 3 * CHUNK + 5, 1, 32, 64, "strong", True),
    (1, 2 * CHUNK + 7, 2, 64, 32, "weak", False),
    (1, 2 * CHUNK, 1, 128, 128, "strong", True),
    (1, 3 * CHUNK + 3, 1, 64, 64, "mixed", True),
    (1, CHUNK + 9, 1, 48, 80, "strong", True),
    (1, CHUNK + 4, 1, 32, 16, "weak", True),
]
if ON_GPU:
    CASES += [(2, 300, 4, 128, 128, "weak", True), (1, 1000, 2, 64, 64, "strong", True),
              (3, 200, 2, 64, 128, "weak", False), (2, 517, 3, 128, 128, "strong", True),
              (2, 300, 2, 128, 128, "mixed", False), (1, 70, 2, 128, 16, "weak", True)]


def make_inputs(B, T, H, K, V, decay, with_h0, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    r = torch.randn(B, T, H, K, generator=gen)
    low = {"weak": 0.05, "strong": 10.0, "mixed": 0.05}[decay]
    w = -low * torch.rand(B, T, H, K, generator=gen)
    if decay == "mixed":
        w[:, CHUNK:2 * CHUNK] *= 200
    k = 0.5 * torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, H, V, generator=gen)
    # as in RWKV-7: a = -kk, b = kk * in-context learning rate, kk a unit key
    kk = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    a, b = -kk, kk * torch.rand(B, T, H, K, generator=gen)
    h0 = torch.randn(B, H, K, V, generator=gen) if with_h0 else None
    xs = [x.to(dtype) for x in (r, w, k, v, a, b)] + [h0]
    return [None if x is None else x.to(DEVICE).requires_grad_() for x in xs]


# bfloat16 runs on the CPU too at heads of 64 and more: under the interpreter the kernels round
# to bfloat16 as the GPU does (`ltm.kernels.common.rounded`) and take the bf16-tile path
@pytest.mark.parametrize("dtype", DTYPES if ON_GPU else (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("B,T,H,K,V,decay,with_h0", CASES,
                         ids=[f"{case_id(*c[:5])}-{c[5]}-h0{int(c[6])}" for c in CASES])
def test_forward_and_gradients_match_the_token_loop(B, T, H, K, V, decay, with_h0, dtype):
    if not ON_GPU and dtype == torch.bfloat16 and (K < 64 or T > 2 * CHUNK):
        pytest.skip("the interpreter checks the bf16 path on a few small cases only")
    seed = case_seed()
    tol_out, tol_grad = TOLERANCE[dtype]
    xs = make_inputs(B, T, H, K, V, decay, with_h0, dtype, seed)
    assert_matches_reference(triton_chunk_rwkv7, naive_rwkv7, xs,
                             ("r", "w", "k", "v", "a", "b", "initial_state"), seed, tol_out, tol_grad)


@pytest.mark.parametrize("fast_span", [0.0, FAST_SPAN], ids=["exact-loops", "tensor-core"])
def test_both_in_chunk_paths(fast_span, monkeypatch):
    # moderate decay (chunk spans up to about 30) runs either path: FAST_SPAN = 0 sends every
    # chunk through the exact column loops, the default every chunk through the products
    monkeypatch.setattr(rwkv7_chunk, "FAST_SPAN", fast_span)
    seed = case_seed()
    xs = make_inputs(1, 2 * CHUNK + 5, 2, 32, 64, "weak", True, torch.float32, seed)
    with torch.no_grad():
        xs[1].mul_(40)
    assert_matches_reference(triton_chunk_rwkv7, naive_rwkv7, xs, ("r", "w", "k", "v", "a", "b", "h0"),
                             seed, 1e-4, 1e-4)


def test_without_final_state():
    seed = case_seed()
    xs = make_inputs(1, CHUNK + 9, 1, 32, 32, "strong", True, torch.float32, seed)
    assert_matches_reference_without_final_state(triton_chunk_rwkv7, naive_rwkv7, xs,
                                                 ("r", "w", "k", "v", "a", "b", "h0"), seed, 1e-4)


def test_final_state_only_gradient():
    # the loss sees the final state alone: dw comes only from the sum_v(ht dht) term and the
    # chunk totals, and do is zero
    seed = case_seed()
    xs = make_inputs(1, 2 * CHUNK + 3, 1, 32, 32, "weak", False, torch.float32, seed)[:6]
    _, ht = triton_chunk_rwkv7(*xs, output_final_state=True)
    ref = [x.detach().double().requires_grad_() for x in xs]
    _, ht_ref = naive_rwkv7(*ref, output_final_state=True)
    gen = torch.Generator().manual_seed(seed + 1)
    dht = torch.randn(ht.shape, generator=gen).to(DEVICE)
    (ht * dht).sum().backward()
    (ht_ref * dht.double()).sum().backward()
    for name, x, x_ref in zip(("r", "w", "k", "v", "a", "b"), xs, ref):
        if name == "r":
            assert x.grad is None or not x.grad.any(), f"seed={seed}: dr should be zero"
            continue
        assert rel_err(x.grad, x_ref.grad) <= 1e-4, f"seed={seed}: d{name}"


# launch paths besides the defaults, forced on every tuned kernel at once (in the interpreter
# only the value block BV changes what runs): the sequential kernels on 16- or 64-wide blocks
LAUNCH_PATHS = {
    "narrow": {"rwkv7.fwd_state": 16, "rwkv7.bwd_state": 16, "rwkv7.output": 32},
    "wide": {"rwkv7.fwd_state": 64, "rwkv7.bwd_state": 64, "rwkv7.output": 64},
}


@pytest.mark.parametrize("path", sorted(LAUNCH_PATHS))
def test_other_value_blocks_match_the_token_loop(monkeypatch, path):
    # odd B, V = 80 (the last block of every width is masked), T three chunks and 5 tokens
    from ltm.kernels import tuning
    forced = {name: {"BV": bv, "num_warps": 4, "num_stages": 1} for name, bv in LAUNCH_PATHS[path].items()}
    monkeypatch.setattr(tuning, "FORCED", forced)
    launched = []
    launch = tuning.launch
    monkeypatch.setattr(tuning, "launch", lambda name, *a, **kw: launched.append(name) or launch(name, *a, **kw))
    seed = case_seed()
    xs = make_inputs(3, 3 * CHUNK + 5, 1, 32, 80, "mixed", True, torch.float32, seed)
    assert_matches_reference(triton_chunk_rwkv7, naive_rwkv7, xs, ("r", "w", "k", "v", "a", "b", "h0"),
                             seed, 1e-4, 1e-4)
    assert set(forced) <= set(launched)
