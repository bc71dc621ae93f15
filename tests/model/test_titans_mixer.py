"""The Titans mixer (MAG and MAL): the chunked memory against the token loop inside the layer,
parallel forward against prefill + decoding, gradients, config checks, torch.compile without
graph breaks, and a tiny model that learns. float64 unless stated."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ltm.model.config import ModelConfig
from ltm.model.decoding import Sampling, generate_tokens
from ltm.model.lm import LTM, build_mixer
from ltm.model import titans as titans_module
from ltm.model.mixers import make_mixer
from ltm.model.titans import Titans
from ltm.ops.titans.chunk import chunk_titans_memory
from ltm.params import ParamsError, from_mapping
from reference import DEVICE, case_seed, rel_err

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 37
VARIANTS = {"mag-deep": dict(titans_arrangement="mag", titans_depth=2),
            "mal-deep": dict(titans_arrangement="mal", titans_depth=3),
            "mag-linear": dict(titans_arrangement="mag", titans_depth=1, titans_grad_clip=None),
            "mag-no-conv": dict(titans_arrangement="mag", titans_depth=2, short_conv=False)}


def build(settings: dict, kernel: str = "torch", H: int = 3, D: int = 8, seed: int = 0) -> Titans:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=VOCAB, n_layers=2, d_model=H * D, n_heads=H, max_seq_len=64,
                      mixer="titans", kernel=kernel, titans_window=5, titans_chunk_size=4,
                      **settings)
    mixer = Titans(cfg).double()
    # the zero / constant inits would hide mistakes: perturb every parameter
    with torch.no_grad():
        for p in mixer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return mixer


@pytest.mark.parametrize("name", VARIANTS)
def test_chunked_memory_matches_the_token_loop_in_the_layer(name):
    seed = case_seed()
    mixer = build(VARIANTS[name], seed=seed)
    x = torch.randn(2, 19, mixer.n_heads * mixer.head_dim, dtype=torch.float64)
    cotangent = torch.randn_like(x)
    results = {}
    for kernel in ("naive", "torch"):
        mixer.kernel = kernel
        mixer.zero_grad()
        xk = x.clone().requires_grad_()
        y, _ = mixer(xk)
        (y * cotangent).sum().backward()
        results[kernel] = (y.detach(), {"x": xk.grad, **{n: p.grad.clone()
                                                        for n, p in mixer.named_parameters()}})
    (y_n, g_n), (y_t, g_t) = results["naive"], results["torch"]
    assert rel_err(y_t, y_n) < 1e-10, f"seed={seed}"
    for key in g_n:
        assert rel_err(g_t[key], g_n[key]) < 1e-10, f"grad of {key}, seed={seed}"


@pytest.mark.parametrize("kernel", ["naive", "torch"])
@pytest.mark.parametrize("name", VARIANTS)
def test_prefill_then_steps_equal_one_parallel_pass(name, kernel):
    """A prefill of 7 tokens ends inside a memory chunk (4) and past the window (5): the steps
    continue the chunk's mini-batch and slide the window over the KV cache."""
    seed = case_seed()
    mixer = build(VARIANTS[name], kernel, seed=seed)
    x = torch.randn(2, 17, mixer.n_heads * mixer.head_dim, dtype=torch.float64)
    y_parallel, no_state = mixer(x)
    assert no_state is None
    state = mixer.init_state(2, x.device, x.dtype)
    outputs = []
    for start, end in [(0, 7), (7, 9)] + [(t, t + 1) for t in range(9, 17)]:
        y, state = mixer(x[:, start:end], state)
        outputs.append(y)
    assert state["pos"] == 17
    assert rel_err(torch.cat(outputs, dim=1), y_parallel) < 1e-10, f"seed={seed}"


def test_every_parameter_gets_a_gradient():
    seed = case_seed()
    for settings in VARIANTS.values():
        mixer = build(settings, seed=seed)
        x = torch.randn(2, 11, mixer.n_heads * mixer.head_dim, dtype=torch.float64)
        mixer(x)[0].square().sum().backward()
        for name, p in mixer.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, f"{name}, seed={seed}"
            assert torch.isfinite(p.grad).all(), f"{name}, seed={seed}"


def test_the_mixer_factories():
    cfg = ModelConfig(vocab_size=VOCAB, d_model=16, n_heads=2, mixer="titans")
    assert isinstance(build_mixer(cfg, 0), Titans)
    with pytest.raises(ValueError, match="built by ltm.model.lm.build_mixer") as info:
        make_mixer(cfg, 0)
    assert "\n" not in str(info.value)


def gates_seen(mixer: Titans, x: torch.Tensor, monkeypatch) -> tuple[torch.Tensor, ...]:
    """theta, alpha, eta (B, T, H) as the mixer hands them to its memory on input x."""
    seen = {}

    def spy(q, k, v, theta, alpha, eta, weights, **options):
        seen["gates"] = theta, alpha, eta
        return original(q, k, v, theta, alpha, eta, weights, **options)

    original = titans_module.titans_memory
    monkeypatch.setattr(titans_module, "titans_memory", spy)
    mixer(x)
    return seen["gates"]


@pytest.mark.parametrize("max_step", [1.0, None])
def test_gates_start_where_documented(max_step, monkeypatch):
    mixer = Titans(ModelConfig(vocab_size=VOCAB, d_model=16, n_heads=2, mixer="titans",
                               titans_max_step=max_step))
    # with the input projection at zero, every gate sits at its initial value: theta 0.1 unbounded,
    # else 3/4 of its bound (max_step / chunk) (1 - eta)
    torch.nn.init.zeros_(mixer.gate_proj.weight)
    theta, alpha, eta = gates_seen(mixer, torch.randn(1, 5, 16), monkeypatch)
    theta_init = 0.1 if max_step is None else 0.75 * max_step / mixer.chunk_size * (1 - 0.1)
    assert torch.allclose(theta, torch.tensor(theta_init))
    assert torch.allclose(alpha, torch.tensor(0.01)) and torch.allclose(eta, torch.tensor(0.1))
    # the memory's last layer starts at zero: it reads zero before learning anything
    assert mixer.memory[-1].abs().sum() == 0 and mixer.memory[0].abs().sum() > 0


def test_a_chunks_summed_step_stays_under_the_max_step(monkeypatch):
    """chunk * theta / (1 - eta) <= titans_max_step for any input, however large the gates'
    inputs; and without the bound, the same input takes larger steps (the bound is not vacuous)."""
    x = 8 * torch.randn(2, 40, 16, dtype=torch.float64)
    steps = {}
    for max_step in (1.0, None):
        torch.manual_seed(0)
        mixer = Titans(ModelConfig(vocab_size=VOCAB, d_model=16, n_heads=2, mixer="titans",
                                   titans_chunk_size=8, titans_max_step=max_step)).double()
        theta, _, eta = gates_seen(mixer, x, monkeypatch)
        steps[max_step] = 8 * (theta / (1 - eta)).max().item()
    assert steps[1.0] <= 1.0 * (1 + 1e-6) < steps[None]


def test_auto_chunk_by_depth():
    """titans_chunk_size auto: 64 for the linear memory, 32 for deeper ones, what the mixer runs
    and what its step bound divides; a number stays itself."""
    cfg = lambda **kw: ModelConfig(vocab_size=VOCAB, d_model=16, n_heads=2, mixer="titans", **kw)  # noqa: E731
    assert cfg(titans_depth=1).titans_chunk == 64
    assert cfg(titans_depth=2).titans_chunk == cfg(titans_depth=3).titans_chunk == 32
    assert cfg(titans_depth=1, titans_chunk_size=8).titans_chunk == 8
    for depth, chunk in ((1, 64), (2, 32)):
        mixer = Titans(cfg(titans_depth=depth))
        assert mixer.chunk_size == chunk
        assert mixer.token_step == pytest.approx(cfg(titans_depth=depth).titans_step_bound / chunk)
    # auto picks sizes the Triton kernels take: no error for either depth
    cfg(titans_depth=1, kernel="triton"), cfg(titans_depth=2, kernel="triton")


def test_auto_bounds_by_depth_and_bad_values_fail_in_one_line(monkeypatch):
    """titans_max_step auto: 1.0 for the linear memory (unbounded, its chunks of 16 trained badly
    on real text), 0.4 for depth 2 and deeper; the mixer's gates follow the resolved bound."""
    cfg = lambda **kw: ModelConfig(vocab_size=VOCAB, d_model=16, n_heads=2, mixer="titans", **kw)  # noqa: E731
    assert cfg(titans_depth=1).titans_step_bound == 1.0
    assert cfg(titans_depth=2).titans_step_bound == cfg(titans_depth=3).titans_step_bound == 0.4
    assert cfg(titans_depth=1, titans_max_step=0.7).titans_step_bound == 0.7
    assert cfg(titans_depth=2, titans_max_step=None).titans_step_bound is None
    x = 8 * torch.randn(1, 32, 16, generator=torch.Generator().manual_seed(0))
    for depth, max_step, bound in ((1, "auto", 1.0), (2, "auto", 0.4), (1, None, None)):
        mixer_cfg = cfg(titans_depth=depth, titans_max_step=max_step, titans_chunk_size=16)
        theta, _, eta = gates_seen(Titans(mixer_cfg), x, monkeypatch)
        step = mixer_cfg.titans_chunk * (theta / (1 - eta)).max().item()
        assert (bound / 2 < step <= bound * (1 + 1e-6)) if bound else step > 1.0
    with pytest.raises(ParamsError, match="titans_max_step"):
        cfg(titans_max_step=-1.0)


@pytest.mark.parametrize("mapping, message", [
    ({"mixer": "titans", "titans_arrangement": "mac"},
     "model.titans_arrangement: expected 'mag' or 'mal', got 'mac'"),
    ({"mixer": "titans", "titans_depth": 0}, "model.titans_depth: must be >= 1, got 0"),
    ({"mixer": "titans", "titans_window": 0}, "model.titans_window: must be >= 1, got 0"),
    ({"mixer": "titans", "titans_chunk_size": 0},
     "model.titans_chunk_size: must be >= 1 or auto, got 0"),
    ({"mixer": "titans", "titans_chunk_size": "16"},
     "model.titans_chunk_size: expected int or 'auto', got '16'"),
    ({"mixer": "titans", "titans_grad_clip": 0.0},
     "model.titans_grad_clip: must be > 0 or null, got 0.0"),
    ({"mixer": "titans", "titans_max_step": 0.0},
     "model.titans_max_step: must be > 0, auto or null, got 0.0"),
    ({"mixer": "titans", "titans_max_step": "big"},
     "model.titans_max_step: expected float or 'auto' or null, got 'big'"),
    ({"mixer": "titans", "kernel": "triton", "titans_depth": 3},
     "model.kernel: mixer 'titans' runs Triton only with titans_depth 1"),
    ({"mixer": "titans", "kernel": "triton", "titans_depth": 1, "titans_chunk_size": 8},
     "model.kernel: mixer 'titans' runs Triton only with titans_depth 1"),
    ({"mixer": "titans", "kernel": "triton", "titans_chunk_size": 64},
     "model.kernel: mixer 'titans' runs Triton only with titans_depth 1"),
    ({"mixer": "titans", "kernel": "fla"}, "model.kernel: fla computes the titans memory only"),
    ({"mixer": "titans", "d_model": 30, "n_heads": 10},
     "model.d_model: attention needs an even head size for RoPE"),
    ({"mixer": "titans", "window": 8}, "model.window: applies to mixer 'attention' only"),
])
def test_bad_config_is_one_clear_line(mapping, message):
    with pytest.raises(ParamsError) as info:
        from_mapping(ModelConfig, mapping, "model")
    assert str(info.value).startswith(message) and "\n" not in str(info.value)



def far_to_near_key_grad(theta: float, eta: float, T: int = 2048) -> float:
    """How strongly the depth-2 memory's last 64 outputs depend on the first 256 keys against the
    last 256 (largest |d(loss)/dk_t| in each span): D 64, hidden 128, chunk 16, clip 1.0, float64,
    the chunked form, unit keys that drift slowly (neighbours nearly equal, as after the short
    convolution), constant gates and alpha 5e-4. A stable memory forgets: < 1; a chaotic one
    amplifies what it read long ago: >> 1."""
    g = torch.Generator().manual_seed(0)
    D, hidden = 64, 128
    noise = torch.randn(1, T, 1, D, generator=g, dtype=torch.float64)
    walk = torch.cumsum(torch.randn(1, T, 1, D, generator=g, dtype=torch.float64), 1)
    k = F.normalize(0.99 * F.normalize(walk, dim=-1) + 0.01 * F.normalize(noise, dim=-1), dim=-1)
    k.requires_grad_()
    q = F.normalize(torch.randn(1, T, 1, D, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(1, T, 1, D, generator=g, dtype=torch.float64)
    weights = [torch.randn(1, D, hidden, generator=g, dtype=torch.float64) * D ** -0.5,
               torch.zeros(1, hidden, D, dtype=torch.float64)]
    gates = [torch.full((1, T, 1), x, dtype=torch.float64) for x in (theta, 5e-4, eta)]
    o, _ = chunk_titans_memory(q, k, v, *gates, weights, chunk_size=16, grad_clip=1.0)
    (o[:, -64:] * torch.randn(o[:, -64:].shape, generator=g, dtype=torch.float64)).sum().backward()
    dk = k.grad.norm(dim=-1)[0, :, 0]
    return (dk[:256].max() / dk[-256:].max()).item()


def test_the_max_step_keeps_the_deep_memory_from_amplifying_the_past():
    """The failure the bound exists for: with a chunk's summed step at 16 * 0.3 / (1 - 0.67) =
    14.5, the last outputs depend on keys 1,800 tokens back far more than on the recent ones
    (chaos: float32 loses such gradients); at the default bound's edge (a summed step of 1.0, at
    no and at strong momentum) the old keys matter less than the recent ones."""
    assert far_to_near_key_grad(0.3, 0.67) > 100
    for eta in (0.0, 0.9):
        assert far_to_near_key_grad(1.0 / 16 * (1 - eta), eta) < 1


def tiny_lm(seed: int = 0, **overrides) -> LTM:
    torch.manual_seed(seed)
    fields = dict(vocab_size=VOCAB, n_layers=2, d_model=24, n_heads=3, d_ff=40, max_seq_len=48,
                  mixer="titans", kernel="torch", titans_window=4, titans_chunk_size=4)
    return LTM(ModelConfig(**{**fields, **overrides}))


@pytest.mark.parametrize("arrangement", ["mag", "mal"])
def test_greedy_generation_matches_the_uncached_loop(arrangement):
    seed = case_seed()
    model = tiny_lm(seed, titans_arrangement=arrangement).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    idx = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(seed))
    got = model.generate(idx, max_new_tokens=8, temperature=0)
    want = model.generate_uncached(idx, max_new_tokens=8, temperature=0)
    assert torch.equal(got, want), f"seed={seed}"


@pytest.mark.parametrize("kernel", ["naive", "torch"])
@pytest.mark.parametrize("arrangement", ["mag", "mal"])
def test_static_decoder_ragged_batch_gives_each_prompt_alone(arrangement, kernel):
    """ltm.model.decoding (the samples stage's decoder): zeroed state = the initial memory, rows
    at their own positions (tensor pos), float32 tokens equal to LTM.generate per prompt."""
    model = tiny_lm(titans_arrangement=arrangement, kernel=kernel).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen) for n in (3, 9, 1, 6)]
    alone = torch.cat([model.generate(p[None], max_new_tokens=10, temperature=0)[:, len(p):]
                       for p in prompts])
    assert torch.equal(generate_tokens(model, prompts, 10, Sampling(0)), alone)


def test_compiled_forward_has_no_graph_breaks():
    torch._dynamo.reset()
    model = tiny_lm(checkpointing=True).train()
    idx, targets = torch.randint(0, VOCAB, (2, 2, 12))
    explanation = torch._dynamo.explain(model)(idx, targets)
    assert explanation.graph_break_count == 0, explanation.break_reasons


def test_checkpointing_and_bf16_autocast():
    """Training switches that reach the mixer: activation checkpointing gives the same loss and
    gradients; bf16 autocast (CPU here) gives a finite loss close to float32's."""
    seed = case_seed()
    idx = torch.randint(0, VOCAB, (2, 15), generator=torch.Generator().manual_seed(seed))
    results = []
    for checkpointing in (False, True):
        model = tiny_lm(seed, checkpointing=checkpointing).double().train()
        _, loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        results.append((loss.item(), [p.grad.clone() for p in model.parameters()]))
    (loss0, grads0), (loss1, grads1) = results
    assert loss0 == loss1, f"seed={seed}"
    assert all(rel_err(a, b) < 1e-12 for a, b in zip(grads1, grads0)), f"seed={seed}"
    model = tiny_lm(seed).train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = model(idx[:, :-1], idx[:, 1:])
    assert torch.isfinite(loss) and abs(loss.item() - loss0) < 0.05 * loss0, f"seed={seed}"


def test_a_tiny_model_learns_a_repeated_batch():
    """float32, the CPU default (kernel torch), 25 AdamW steps on one batch."""
    seed = case_seed()
    model = tiny_lm(seed).train()
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, VOCAB, (4, 25), generator=gen)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(25):
        _, loss = model(idx[:, :-1], idx[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(map(lambda v: v == v, losses)), f"NaN loss, seed={seed}"
    assert losses[-1] < 0.5 * losses[0], f"losses {losses[0]:.3f} -> {losses[-1]:.3f}, seed={seed}"


def test_flops_count_the_window_and_the_memory():
    shallow = tiny_lm(titans_depth=1)
    deep = tiny_lm(titans_depth=2, titans_expansion=2)
    D, H = 8, 3
    attention = 12 * 24 * 4
    base = shallow.flops_per_token(32) - shallow.cfg.n_layers * (attention + 24 * H * D * D)
    assert base == 6 * shallow.num_params() + 6 * 24 * VOCAB
    deep_mixer = attention + 24 * H * (D * 2 * D + 2 * D * D)
    assert deep.flops_per_token(32) == 6 * deep.num_params() + 6 * 24 * VOCAB + 2 * deep_mixer


def test_triton_kernel_in_the_layer_matches_torch():
    """The linear memory by the Triton kernel (the interpreter on a CPU) inside the layer, float32:
    the torch kernel's outputs and gradients, and a prefill ending mid-chunk then steps."""
    seed = case_seed()
    settings = dict(titans_arrangement="mag", titans_depth=1, titans_chunk_size=16)
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=VOCAB, n_layers=2, d_model=32, n_heads=2, max_seq_len=64,
                      mixer="titans", kernel="triton", titans_window=5, **settings)
    mixer = Titans(cfg)
    with torch.no_grad():
        for p in mixer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    mixer, x = mixer.to(DEVICE), torch.randn(2, 37, 32).to(DEVICE)
    results = {}
    for kernel in ("torch", "triton"):
        mixer.kernel = kernel
        mixer.zero_grad()
        y, _ = mixer(x)
        y.square().sum().backward()
        state, steps = mixer.init_state(2, x.device, x.dtype), []
        for start, end in [(0, 21)] + [(t, t + 1) for t in range(21, 25)]:
            y_part, state = mixer(x[:, start:end], state)
            steps.append(y_part)
        results[kernel] = (y.detach(), torch.cat(steps, 1).detach(),
                           [p.grad.clone() for p in mixer.parameters()])
    (y_t, s_t, g_t), (y_k, s_k, g_k) = results["torch"], results["triton"]
    assert rel_err(y_k, y_t) < 1e-5 and rel_err(s_k, s_t) < 1e-5, f"seed={seed}"
    assert all(rel_err(a, b) < 1e-4 for a, b in zip(g_k, g_t)), f"seed={seed}"


def test_compiled_triton_model_matches_eager_without_graph_breaks():
    """The Triton memory is a custom operator, opaque to torch.compile (also on a CPU, where the
    interpreter runs it): one graph, and the compiled loss and gradients are the eager ones."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=VOCAB, n_layers=2, d_model=32, n_heads=2, max_seq_len=64,
                      mixer="titans", kernel="triton", titans_depth=1, titans_chunk_size=16,
                      titans_window=8, fused_conv=DEVICE.type == "cuda")
    # the fused convolution's Triton launches are traced by torch.compile on a GPU only
    model = LTM(cfg).to(DEVICE).train()
    idx, targets = torch.randint(0, VOCAB, (2, 2, 40), device=DEVICE)
    explanation = torch._dynamo.explain(model)(idx, targets)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    results = []
    for step in (model, torch.compile(model)):
        model.zero_grad()
        _, loss = step(idx, targets)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (loss_e, grads_e), (loss_c, grads_c) = results
    assert rel_err(loss_c, loss_e) < 1e-5
    assert all(rel_err(a, b) < 1e-4 for a, b in zip(grads_c, grads_e))
