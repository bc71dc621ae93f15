"""The roadmap's switches of the hierarchical DeltaNet (ltm/model/mixers.py DeltaNet, model.hier_* and
model.fused_proj) against the unchanged layer: the exact ones (the dual op, fused projections,
chunk size) to float64 rounding, forward and backward; the approximate ones (mix by sum, the fast
state read at chunk boundaries, the event-driven slow state) for what they change; decoding step
by step equals the full forward for every variant (each is causal and defined token by token)."""
import pytest
import torch

from ltm.model.config import ModelConfig
from ltm.model.decoding import Decoder, Sampling
from ltm.model.mixers import DeltaNet
from ltm.model.lm import LTM
from ltm.params import ParamsError
from reference import DEVICE, case_seed, rel_err

BASE = dict(mixer="deltanet", hierarchical=True)
VARIANTS = {"stacked": {}, "dual": {"hier_op": "dual"}, "sum": {"hier_mix": "sum"},
            "fast-chunk": {"hier_fast_read": "chunk"}, "event": {"hier_slow_threshold": 0.5},
            "fused-proj": {"fused_proj": True},
            "all": {"hier_op": "dual", "hier_mix": "sum", "hier_fast_read": "chunk",
                    "hier_slow_threshold": 0.5, "fused_proj": True}}


def layer(settings: dict, H=3, D=6, chunk=8, kernel="torch", seed=0) -> DeltaNet:
    cfg = ModelConfig(vocab_size=11, d_model=H * D, n_heads=H, chunk_size=chunk, kernel=kernel,
                      max_seq_len=256, **BASE, **settings)
    torch.manual_seed(seed)
    mixer = DeltaNet(cfg).double()
    with torch.no_grad():  # perturb the zero / one inits, which would hide mistakes
        for p in mixer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return mixer


def forward_backward(mixer: DeltaNet, x: torch.Tensor, seed: int):
    mixer.zero_grad()
    x = x.clone().requires_grad_()
    y, _ = mixer(x)
    weight = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=y.dtype)
    weight = weight.to(y.device)
    (y * weight).sum().backward()
    return y.detach(), {"x": x.grad, **{n: p.grad.clone() for n, p in mixer.named_parameters()
                                        if p.grad is not None}}


def assert_same(a, b, bound, seed):
    (y_a, g_a), (y_b, g_b) = a, b
    assert rel_err(y_a, y_b) < bound, f"output, seed={seed}"
    assert g_a.keys() == g_b.keys()
    for key in g_a:
        assert rel_err(g_a[key], g_b[key]) < bound, f"grad of {key}, seed={seed}"


@pytest.mark.parametrize("kernel", ["naive", "torch"])
@pytest.mark.parametrize("settings", [{"hier_op": "dual"}, {"fused_proj": True},
                                      {"hier_op": "dual", "fused_proj": True}],
                         ids=["dual", "fused-proj", "both"])
@pytest.mark.parametrize("T", [1, 13, 37])
def test_exact_switches_equal_the_unchanged_layer(settings, kernel, T):
    """float64: the same function to 1e-10 relative, output and every gradient."""
    seed = case_seed()
    x = torch.randn(2, T, 18, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    base, switched = layer({}, kernel=kernel, seed=seed), layer(settings, kernel=kernel, seed=seed)
    switched.load_state_dict(base.state_dict())
    assert_same(forward_backward(switched, x, seed), forward_backward(base, x, seed), 1e-10, seed)


def test_dual_op_on_the_triton_kernel_equals_the_stacked_layer():
    """kernel triton: hier_op dual runs the Triton delta rule with grouped heads (no copies of q,
    k, v); the same kernels in the same order, so float32 agrees to rounding of the gradient sums."""
    pytest.importorskip("triton")
    seed = case_seed()
    x = torch.randn(2, 70, 64, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    base = layer({}, H=2, D=32, kernel="triton", seed=seed).float().to(DEVICE)
    switched = layer({"hier_op": "dual"}, H=2, D=32, kernel="triton", seed=seed).float().to(DEVICE)
    switched.load_state_dict(base.state_dict())
    assert switched.dual
    assert_same(forward_backward(switched, x, seed), forward_backward(base, x, seed), 1e-6, seed)


@pytest.mark.parametrize("settings", [{}, {"hier_op": "dual"}], ids=["stacked", "dual"])
def test_chunk_size_64_and_128_give_the_same_layer(settings):
    """model.chunk_size is honoured by the hierarchical path (torch kernel) and is exact: 64 vs
    128 on a sequence longer than both and a multiple of neither."""
    seed = case_seed()
    x = torch.randn(1, 150, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    a = layer(settings, H=2, D=4, chunk=64, seed=seed)
    b = layer(settings, H=2, D=4, chunk=128, seed=seed)
    b.load_state_dict(a.state_dict())
    assert_same(forward_backward(b, x, seed), forward_backward(a, x, seed), 1e-10, seed)


def test_mix_sum_is_the_even_gate_up_to_the_norm():
    """hier_mix sum: fast + slow. The gate at sigmoid(0) = 1/2 gives half of it, which the
    per-head RMSNorm scales back up: equal up to the norm's eps. The mix columns get no gradient."""
    seed = case_seed()
    x = torch.randn(2, 21, 18, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    gate, summed = layer({}, seed=seed), layer({"hier_mix": "sum"}, seed=seed)
    summed.load_state_dict(gate.state_dict())
    # the mix logits' rows of gate_proj (the alignment padding after them is unused)
    mix_rows = slice(sum(gate.gate_widths[:3]), sum(gate.gate_widths[:4]))
    for mixer in (gate, summed):
        mixer.norm_eps = 1e-30
        with torch.no_grad():
            mixer.gate_proj.weight[mix_rows] = 0  # sigmoid(0) = 1/2
    assert rel_err(summed(x)[0], gate(x)[0]) < 1e-10
    _, grads = forward_backward(summed, x, seed)
    used = torch.ones(grads["gate_proj.weight"].shape[0], dtype=torch.bool)
    used[mix_rows] = False
    used[sum(gate.gate_widths[:4]):] = False
    assert grads["gate_proj.weight"][mix_rows].abs().max() == 0
    assert grads["gate_proj.weight"][used].abs().max() > 0


@pytest.mark.parametrize("name", ["fast-chunk", "event"])
def test_approximate_variants_change_only_what_they_say(name):
    """The fast-chunk read changes the output from the first token (its fast part reads the zero
    state inside chunk 0); the event-driven slow state leaves chunk 0 as the exact layer has it
    (read as it runs) and changes later chunks when an update is dropped."""
    seed = case_seed()
    x = torch.randn(2, 40, 18, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    exact = layer({}, seed=seed)
    settings = dict(VARIANTS[name])
    if name == "event":
        settings["hier_slow_threshold"] = 1e9  # no slow update is ever kept
    variant = layer(settings, seed=seed)
    variant.load_state_dict(exact.state_dict())
    y_exact, y = exact(x)[0], variant(x)[0]
    if name == "event":
        assert rel_err(y[:, :8], y_exact[:, :8]) < 1e-10
        assert rel_err(y[:, 8:], y_exact[:, 8:]) > 1e-4
        zero = layer({"hier_slow_threshold": 0.0}, seed=seed)
        zero.load_state_dict(exact.state_dict())
        assert rel_err(zero(x)[0], y_exact) < 1e-10  # threshold 0 keeps every update
    else:
        assert rel_err(y[:, :1], y_exact[:, :1]) > 1e-4
    _, grads = forward_backward(variant, x, seed)
    assert all(torch.isfinite(g).all() for g in grads.values())
    assert grads["x"].abs().max() > 0


@pytest.mark.parametrize("kernel", ["naive", "torch"])
@pytest.mark.parametrize("name", VARIANTS)
def test_prefill_then_steps_equal_the_full_forward(name, kernel):
    """Generation: a prefill of 11 tokens (inside a chunk of 8), then one token at a time,
    equals the parallel forward, for every variant."""
    seed = case_seed()
    x = torch.randn(2, 30, 18, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    mixer = layer(VARIANTS[name], kernel=kernel, seed=seed)
    whole, _ = mixer(x)
    state = mixer.init_state(2, x.device, x.dtype)
    prefill, state = mixer(x[:, :11], state)
    steps = [prefill]
    for t in range(11, 30):
        y, state = mixer(x[:, t:t + 1], state)
        steps.append(y)
    assert rel_err(torch.cat(steps, dim=1), whole) < 1e-10, f"seed={seed}"


@pytest.mark.parametrize("name", ["dual", "all"])
def test_static_decoder_runs_every_variant(name):
    """ltm.generate's static decoder (state buffers copied in place, per-row positions as a
    tensor) gives each prompt the greedy tokens of LTM.generate; the two prompts end at
    different places inside their chunks."""
    cfg = ModelConfig(vocab_size=13, n_layers=2, d_model=16, n_heads=2, max_seq_len=40,
                      chunk_size=4, **BASE, **VARIANTS[name])
    torch.manual_seed(0)
    model = LTM(cfg).eval()
    prompts = [torch.tensor([1, 2, 3, 4, 5, 6]), torch.tensor([7, 8, 9])]
    got = Decoder(model, batch=2, length=20, sampling=Sampling(0), graph=False).generate(prompts, 9)
    for row, prompt in enumerate(prompts):
        expected = model.generate(prompt[None], max_new_tokens=9, temperature=0.0)
        assert torch.equal(got[row], expected[0, len(prompt):]), row


@pytest.mark.parametrize("key,value", [("hier_op", "x"), ("hier_mix", "x"),
                                       ("hier_fast_read", "x"), ("hier_slow_threshold", -1.0)])
def test_bad_switch_values_are_one_line_errors(key, value):
    with pytest.raises(ParamsError, match=key):
        ModelConfig(**BASE, **{key: value})
