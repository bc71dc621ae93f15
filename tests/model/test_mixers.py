"""Token mixers: the chunked recurrences against the token-by-token reference, state hand-over
(prefill then decoding) against one parallel pass, attention's window and RoPE against plain
loops, and the kernel dispatch's errors. Everything in float64 unless stated."""
from __future__ import annotations

import importlib.util
import random

import pytest
import torch
import torch.nn.functional as F

from ltm.model.mixers import (Attention, DeltaNet, RWKV7TimeMix, ShortConv, apply_rope,
                              fused_conv_runs, make_mixer, rope_tables)
from ltm.model.lm import ModelConfig
from ltm.ops import check_kernel
from ltm.ops.delta_rule import delta_rule


LINEAR_MIXERS = {
    "rwkv7": dict(mixer="rwkv7"),
    "deltanet": dict(mixer="deltanet"),
    "deltanet-hier": dict(mixer="deltanet", hierarchical=True),
    "deltanet-noconv": dict(mixer="deltanet", short_conv=False),
}
ALL_MIXERS = {"attention": dict(mixer="attention"),
              "attention-window": dict(mixer="attention", window=5), **LINEAR_MIXERS}
# (B, T, H, D, chunk_size): T not a multiple of the chunk, T < chunk, odd head counts
SHAPES = [(2, 37, 3, 8, 16), (1, 9, 1, 16, 16), (3, 20, 2, 6, 4)]


def shape_id(shape) -> str:
    B, T, H, D, chunk = shape
    return f"B{B}-T{T}-H{H}-D{D}-C{chunk}"


def new_seed() -> int:
    seed = random.randrange(2 ** 31)
    torch.manual_seed(seed)
    return seed


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def build(settings: dict, H: int, D: int, chunk: int = 16, kernel: str = "naive", layer: int = 1):
    cfg = ModelConfig(vocab_size=11, n_layers=3, d_model=H * D, n_heads=H, chunk_size=chunk,
                      kernel=kernel, max_seq_len=64, **settings)
    mixer = make_mixer(cfg, layer).double()
    # the zero/one inits of some parameters would hide mistakes: perturb every parameter
    with torch.no_grad():
        for p in mixer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return mixer


def random_state(mixer, B: int) -> dict:
    """A non-zero generation state of the kind mixer.init_state returns."""
    state = mixer.init_state(B, torch.device("cpu"), torch.float64)
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            # recurrent states are kept small, as after a few normalised updates
            state[key] = 0.3 * torch.randn_like(value)
    return state


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("name", LINEAR_MIXERS)
def test_chunk_matches_naive_forward_and_backward(name, shape):
    B, T, H, D, chunk = shape
    seed = new_seed()
    mixer = build(LINEAR_MIXERS[name], H, D, chunk)
    x = torch.randn(B, T, H * D, dtype=torch.float64)
    state = random_state(mixer, B)
    # random cotangents, so every output element and the final state reach the gradients
    y_weight = torch.randn(B, T, H * D, dtype=torch.float64)
    results = {}
    for kernel in ("naive", "torch"):
        mixer.kernel = kernel
        mixer.zero_grad()
        xk = x.clone().requires_grad_()
        sk = {key: v.clone().requires_grad_() for key, v in state.items() if v is not None}
        y, final = mixer(xk, {**state, **sk})
        recurrent = final["wkv" if name == "rwkv7" else "S"]
        ((y * y_weight).sum() + 0.1 * recurrent.sum()).backward()
        grads = {"x": xk.grad, **{f"state.{k}": v.grad for k, v in sk.items()},
                 **{n: p.grad.clone() for n, p in mixer.named_parameters()}}
        results[kernel] = (y.detach(), recurrent.detach(), grads)
    (y_n, s_n, g_n), (y_t, s_t, g_t) = results["naive"], results["torch"]
    # float64 throughout: the two forms differ only by rounding
    bound = 1e-9
    assert rel_err(y_t, y_n) < bound, f"output, seed={seed}"
    assert rel_err(s_t, s_n) < bound, f"final state, seed={seed}"
    for key in g_n:
        assert rel_err(g_t[key], g_n[key]) < bound, f"grad of {key}, seed={seed}"


@pytest.mark.parametrize("kernel", ["naive", "torch"])
@pytest.mark.parametrize("name", ALL_MIXERS)
def test_prefill_then_steps_equal_one_parallel_pass(name, kernel):
    B, T, H, D, chunk = 2, 23, 3, 8, 8
    seed = new_seed()
    mixer = build(ALL_MIXERS[name], H, D, chunk, kernel)
    x = torch.randn(B, T, H * D, dtype=torch.float64)
    y_parallel, no_state = mixer(x)
    assert no_state is None
    state = mixer.init_state(B, x.device, x.dtype)
    prefill, state = mixer(x[:, :11], state)
    steps = []
    for t in range(11, T):
        y, state = mixer(x[:, t:t + 1], state)
        steps.append(y)
    y_cached = torch.cat([prefill, *steps], dim=1)
    assert rel_err(y_cached, y_parallel) < 1e-10, f"seed={seed}"


@pytest.mark.parametrize("name", ALL_MIXERS)
def test_two_prefills_equal_one(name):
    """A prefill can continue from a non-empty state (chunk form with an initial state, or queries
    against a partly filled KV cache)."""
    B, T, H, D = 2, 19, 2, 8
    seed = new_seed()
    mixer = build(ALL_MIXERS[name], H, D)
    x = torch.randn(B, T, H * D, dtype=torch.float64)
    whole, _ = mixer(x, mixer.init_state(B, x.device, x.dtype))
    first, state = mixer(x[:, :7], mixer.init_state(B, x.device, x.dtype))
    second, _ = mixer(x[:, 7:], state)
    assert rel_err(torch.cat([first, second], dim=1), whole) < 1e-10, f"seed={seed}"


def test_rope_rotates_like_complex_multiplication():
    seed = new_seed()
    B, H, T, D = 2, 3, 10, 8
    x = torch.randn(B, H, T, D, dtype=torch.float64)
    cos, sin = rope_tables(D, T, 10000.0)
    got = apply_rope(x, cos.double(), sin.double())
    # pairs (i, i + D/2) as complex numbers turned by angle t * theta^(-2i/D)
    angles = torch.outer(torch.arange(T, dtype=torch.float64),
                         10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D))
    turned = torch.complex(x[..., :D // 2], x[..., D // 2:]) * torch.polar(torch.ones_like(angles),
                                                                          angles)
    want = torch.cat([turned.real, turned.imag], dim=-1)
    # the tables are stored in float32
    assert rel_err(got, want) < 1e-6, f"seed={seed}"


@pytest.mark.parametrize("window", [None, 1, 4, 5, 40])  # 1, 4, 5: in blocks (T > 2 window)
def test_attention_matches_loop_over_queries(window):
    B, T, H, D = 2, 13, 2, 8
    seed = new_seed()
    mixer = build(dict(mixer="attention", window=window), H, D)
    x = torch.randn(B, T, H * D, dtype=torch.float64)
    got, _ = mixer(x)
    q, k, v = mixer.qkv(x).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
    q, k = apply_rope(q, mixer.cos[:T], mixer.sin[:T]), apply_rope(k, mixer.cos[:T], mixer.sin[:T])
    rows = []
    for t in range(T):
        start = 0 if window is None else max(0, t - window + 1)
        scores = q[:, :, t:t + 1] @ k[:, :, start:t + 1].transpose(-1, -2) / D ** 0.5
        rows.append(scores.softmax(-1) @ v[:, :, start:t + 1])
    want = mixer.out_proj(torch.cat(rows, dim=2).transpose(1, 2).reshape(B, T, H * D))
    assert rel_err(got, want) < 1e-12, f"seed={seed}"


def test_short_conv_is_a_causal_depthwise_convolution():
    seed = new_seed()
    B, T, channels, width = 2, 9, 5, 4
    conv = ShortConv(channels, width).double()
    x = torch.randn(B, T, channels, dtype=torch.float64)
    got, state = conv(x)
    want = F.conv1d(x.transpose(1, 2), conv.weight, padding=width - 1, groups=channels)[..., :T]
    assert rel_err(got, F.silu(want).transpose(1, 2)) < 1e-12, f"seed={seed}"
    assert torch.equal(state, x[:, -(width - 1):].transpose(1, 2))


def test_linear_mixer_types():
    assert isinstance(build(LINEAR_MIXERS["rwkv7"], 2, 4), RWKV7TimeMix)
    assert isinstance(build(LINEAR_MIXERS["deltanet"], 2, 4), DeltaNet)
    assert isinstance(build(ALL_MIXERS["attention"], 2, 4), Attention)


def test_hierarchical_has_fast_and_slow_decay():
    mixer = build(LINEAR_MIXERS["deltanet-hier"], 3, 4)
    A = mixer.A_log.detach().exp()
    assert A.shape == (6,)
    assert A[:3].min() > A[3:].max()


def test_unknown_kernel_is_one_clear_line():
    with pytest.raises(ValueError, match=r"^kernel: unknown kernel 'cuda'") as info:
        check_kernel("cuda")
    assert "\n" not in str(info.value)
    q = torch.randn(1, 3, 1, 4)
    with pytest.raises(ValueError, match="unknown kernel"):
        delta_rule(q, q, q, q[..., 0], q[..., 0], kernel="cuda", chunk_size=4)


@pytest.mark.skipif(importlib.util.find_spec("fla") is not None, reason="fla is installed")
def test_missing_fla_is_one_clear_line():
    with pytest.raises(ValueError, match=r"^kernel: 'fla' needs flash-linear-attention") as info:
        check_kernel("fla")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kernel, fused_conv, device, runs", [
    ("triton", True, "cpu", True), ("triton", False, "cuda", False), ("auto", True, "cuda", True),
    ("auto", True, "cpu", False), ("auto", False, "cuda", False), ("torch", True, "cuda", False),
    ("fla", True, "cuda", False)])
def test_the_fused_convolution_runs_with_ours_and_with_auto_on_a_gpu(kernel, fused_conv, device,
                                                                     runs):
    assert fused_conv_runs(kernel, fused_conv, torch.device(device)) is runs


@pytest.mark.parametrize("name", sorted(LINEAR_MIXERS))
def test_kernel_auto_on_the_cpu_is_the_torch_layer(name):
    """float64, forward and backward: the same numbers as kernel torch (auto's CPU choice)."""
    mixer = build(LINEAR_MIXERS[name], 3, 8, kernel="torch")
    x = torch.randn(2, 37, 24, dtype=torch.float64)
    results = {}
    for kernel in ("torch", "auto"):
        mixer.kernel = kernel
        mixer.zero_grad()
        xk = x.clone().requires_grad_()
        y, _ = mixer(xk)
        y.square().sum().backward()
        results[kernel] = [y.detach(), xk.grad, *(p.grad.clone() for p in mixer.parameters())]
    assert all(torch.equal(a, b) for a, b in zip(results["torch"], results["auto"]))


@pytest.mark.parametrize("fused_conv", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("name", ["deltanet", "deltanet-hier"])
def test_triton_deltanet_layer_matches_the_torch_layer(name, fused_conv, monkeypatch):
    """kernel triton fuses the convolution, SiLU and q, k norms (kernels/short_conv.py) unless
    model.fused_conv is false, and runs the Triton delta rule: same layer output and parameter
    gradients as kernel torch, float32."""
    from ltm.kernels import short_conv
    calls = []
    fused = short_conv.short_conv_qkv
    monkeypatch.setattr(short_conv, "short_conv_qkv", lambda *a, **k: calls.append(1) or fused(*a, **k))
    seed = new_seed()
    # Triton runs on a GPU where there is one, through its interpreter on the CPU otherwise
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    mixer = build(dict(LINEAR_MIXERS[name], fused_conv=fused_conv), 2, 16, kernel="torch")
    mixer = mixer.float().to(device)
    x = torch.randn(1, 21, 32, device=device)
    results = {}
    for kernel in ("torch", "triton"):
        mixer.kernel = kernel
        assert mixer.fused_conv == fused_conv
        mixer.zero_grad()
        xk = x.clone().requires_grad_()
        y, _ = mixer(xk)
        (y * torch.linspace(-1, 1, y.numel(), device=device).view_as(y)).sum().backward()
        results[kernel] = (y.detach(), {"x": xk.grad, **{n: p.grad.clone() for n, p in mixer.named_parameters()}})
    (y_t, g_t), (y_k, g_k) = results["torch"], results["triton"]
    assert len(calls) == (1 if fused_conv else 0)
    assert rel_err(y_k, y_t) < 1e-4, f"output, seed={seed}"
    for key in g_t:
        assert rel_err(g_k[key], g_t[key]) < 1e-4, f"grad of {key}, seed={seed}"


@pytest.mark.parametrize("hierarchical,d_model,n_heads", [(True, 96, 12), (False, 96, 12),
                                                          (True, 30, 5), (False, 21, 3)])
def test_deltanet_gate_projection_is_padded_to_aligned_rows(hierarchical, d_model, n_heads):
    """gate_proj's width is a multiple of 8 (aligned bf16 GEMMs); the padding columns feed nothing:
    they get no gradient, and the used columns do."""
    cfg = ModelConfig(vocab_size=32, d_model=d_model, n_heads=n_heads, n_layers=1,
                      mixer="deltanet", hierarchical=hierarchical, kernel="torch")
    torch.manual_seed(0)
    layer = DeltaNet(cfg).double()
    used = sum(layer.gate_widths[:-1])
    assert layer.gate_proj.out_features % 8 == 0 and layer.gate_proj.out_features - used < 8
    layer(torch.randn(2, 9, d_model, dtype=torch.float64))[0].square().sum().backward()
    grad = layer.gate_proj.weight.grad
    assert grad[used:].abs().sum() == 0  # (empty when no padding was needed)
    assert grad[:used].abs().sum(1).min() > 0
