"""The Triton Titans memory (linear) against the float64 token loop, forward and every gradient,
and the op's kernel="triton" path (states entering mid-chunk, the state a step continues)."""
import pytest
import torch
import torch.nn.functional as F
from reference import DEVICE, DTYPES, ON_GPU, TOLERANCE, case_id, case_seed, rel_err
from titans_op_cases import triton_and_torch_from_any_state

from ltm.kernels.titans import triton_chunk_titans_memory
from ltm.ops.titans import TitansState, chunk_titans_memory, naive_titans_memory, titans_memory

NAMES = ("q", "k", "v", "theta", "alpha", "eta")
# (B, T, H, K, V, chunk, clip): T < chunk, T = chunk, odd T over several chunks, odd head sizes;
# clip None, or small enough to act on most tokens
CASES = [
    (1, 5, 1, 16, 16, 16, 0.5),
    (2, 16, 2, 20, 24, 16, None),
    (1, 37, 3, 32, 17, 16, 0.3),
    (2, 70, 1, 16, 32, 32, 1.0),
    (1, 67, 2, 24, 16, 64, None),
]
if ON_GPU:
    CASES += [(2, 300, 4, 64, 64, 16, 1.0), (1, 1000, 2, 128, 128, 32, 1.0),
              (3, 200, 2, 64, 128, 32, None), (2, 500, 2, 128, 128, 64, 1.0)]


def make_inputs(B, T, H, K, V, dtype, seed):
    """Unit keys and queries (as the mixer feeds them), gates like `tests/ops/test_titans.py`'s
    (one alpha = 1, one eta = 0), a random initial memory and momentum."""
    gen = torch.Generator().manual_seed(seed)
    x = {"q": F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1),
         "k": F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1),
         "v": torch.randn(B, T, H, V, generator=gen),
         "theta": 0.5 * torch.rand(B, T, H, generator=gen),
         "alpha": 0.3 * torch.rand(B, T, H, generator=gen),
         "eta": torch.rand(B, T, H, generator=gen)}
    if T > 3:
        x["alpha"][0, 2, 0], x["eta"][-1, 3, -1] = 1.0, 0.0
    for name in ("q", "k", "v"):
        x[name] = x[name].to(dtype)
    w0 = torch.randn(B, H, K, V, generator=gen) * K ** -0.5
    s0 = 0.1 * torch.randn(B, H, K, V, generator=gen)
    x = {n: t.to(DEVICE).requires_grad_() for n, t in x.items()}
    return x, w0.to(DEVICE).requires_grad_(), s0.to(DEVICE).requires_grad_()


def _reference(x, w0, s0, chunk, clip):
    """The float64 token loop from (w0, s0): outputs, final memory and momentum."""
    xs = {n: t.detach().double().requires_grad_() for n, t in x.items()}
    w, s = w0.detach().double().requires_grad_(), s0.detach().double().requires_grad_()
    state = TitansState((w,), (s,), (w,), 0)
    o, final = naive_titans_memory(*xs.values(), [w[0, :, :, :]], chunk_size=chunk, grad_clip=clip,
                                   initial_state=state, output_final_state=True)
    return o, final.weights[0], final.momenta[0], list(xs.values()) + [w, s]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{case_id(*c[:5])}-C{c[5]}-clip{c[6]}")
def test_kernel_matches_token_loop(case, dtype):
    B, T, H, K, V, chunk, clip = case
    if chunk > 32 and max(K, V) > 64 and dtype != torch.bfloat16:
        pytest.skip("chunk 64 at head size 128 runs in bfloat16 only (test_bad_input_is_one_line)")
    seed = case_seed()
    x, w0, s0 = make_inputs(B, T, H, K, V, dtype, seed)
    o, wt, st = triton_chunk_titans_memory(*x.values(), w0, s0, chunk_size=chunk, grad_clip=clip,
                                           output_final_state=True)
    o_ref, wt_ref, st_ref, ref_inputs = _reference(x, w0, s0, chunk, clip)
    gen = torch.Generator().manual_seed(seed + 1)
    do, dwt, dst = (torch.randn(t.shape, generator=gen, dtype=torch.float64).to(DEVICE)
                    for t in (o_ref, wt_ref, st_ref))
    ((o.double() * do).sum() + (wt.double() * dwt).sum() + (st.double() * dst).sum()).backward()
    ((o_ref * do).sum() + (wt_ref * dwt).sum() + (st_ref * dst).sum()).backward()
    out_bound, grad_bound = TOLERANCE[dtype]
    for name, got, want in (("o", o, o_ref), ("final memory", wt, wt_ref), ("final momentum", st, st_ref)):
        err = rel_err(got, want)
        assert err < out_bound, f"{name}: {err:.2e} >= {out_bound} (seed={seed})"
    for name, got, want in zip(NAMES + ("w0", "s0"), list(x.values()) + [w0, s0], ref_inputs):
        err = rel_err(got.grad, want.grad)
        assert err < grad_bound, f"d{name}: {err:.2e} >= {grad_bound} (seed={seed})"


def _op_inputs(B, T, H, D, seed):
    gen = torch.Generator().manual_seed(seed)
    x, _, _ = make_inputs(B, T, H, D, D, torch.float32, seed)
    weights = [(torch.randn(H, D, D, generator=gen) * D ** -0.5).to(DEVICE).requires_grad_()]
    return x, weights


@pytest.mark.parametrize("prefill, T", [(0, 40), (5, 40), (9, 3), (0, 16)])
def test_op_continues_any_state_exactly(prefill, T):
    """kernel="triton" through the op: a state entering mid-chunk, a tail after the last chunk
    boundary, the final state (chunk-start weights included) and a step after it, all equal to
    the chunked PyTorch form's; gradients too."""
    seed = case_seed()
    x, weights = _op_inputs(2, prefill + T, 2, 16, seed)
    results = triton_and_torch_from_any_state(x, weights, prefill)
    for got, want in zip(results["triton"], results["torch"]):
        assert rel_err(got, want) < 1e-4, f"seed={seed}"


def test_without_final_state_matches():
    """The op without output_final_state runs every token through the kernel (no tail)."""
    x, weights = _op_inputs(1, 21, 1, 16, case_seed())
    o, none = titans_memory(*x.values(), weights, kernel="triton", chunk_size=16, grad_clip=1.0)
    o_ref, _ = chunk_titans_memory(*x.values(), weights, chunk_size=16, grad_clip=1.0)
    assert none is None and rel_err(o, o_ref) < 1e-5


@pytest.mark.parametrize("change, message", [
    ({"chunk_size": 8}, "chunk_size must be one of (16, 32, 64)"),
    ({"theta": "short"}, "theta must be [B, T, H]"),
    ({"v": "long"}, "v must be [B, T, H, V]"),
    ({"w0": "short"}, "w0 must be [B, H, K, V]"),
    ({"chunk_size": 64, "wide": True}, "chunk_size 64 with head size 128 runs in bfloat16 only"),
])
def test_bad_input_is_one_line(change, message):
    D = 128 if change.pop("wide", False) else 16
    x, w0, s0 = make_inputs(1, 5, 1, D, D, torch.float32, 0)
    args = {**{n: t.detach() for n, t in x.items()}, "w0": w0.detach(), "s0": s0.detach(),
            "chunk_size": 16}
    for name, how in change.items():
        args[name] = how if name == "chunk_size" else (
            args[name][:, :-1] if how == "short" else torch.cat([args[name]] * 2, 1))
    chunk = args.pop("chunk_size")
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")) as info:
        triton_chunk_titans_memory(*args.values(), chunk_size=chunk)
    assert "\n" not in str(info.value)

