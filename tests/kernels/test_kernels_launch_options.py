"""Launch options passed per call (the keyword arguments of `triton_chunk_delta_rule` and of
`triton_fused_recurrent_rwkv7`) against the module switches the GPU scripts used to patch: each
option launches what the patched module launched and gives its result bit for bit, an option that
names the default changes nothing, and a value the launchers do not know is a one-line error."""
import pytest
import torch

from ltm.kernels import tuning
from ltm.kernels.delta_rule import chunk as delta_rule_chunk
from ltm.kernels.delta_rule import launch_choices, segment_choices, triton_chunk_delta_rule
from ltm.kernels.delta_rule.chunk import CHUNK
from ltm.kernels.rwkv7 import fused_recurrent, triton_fused_recurrent_rwkv7
from reference import DEVICE, case_seed
from test_kernels_delta_rule import make_inputs
from test_kernels_rwkv7 import make_inputs as make_rwkv7_inputs


def _described(value):
    """A launch argument as a comparable value: a tensor by its dtype and shape."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape))
    return value


class _NoRun:
    """A kernel that runs nothing when launched."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def spy_on_launches(monkeypatch, dry: bool = False) -> list:
    """Every tuner launch from here on: (kernel name, its arguments), tensors by dtype and shape.
    `dry`: the tuner chooses as ever but no kernel runs (outputs stay unwritten), for the launches
    alone: the launchers choose from shapes and options, never from a tensor's values, which
    test_options_naming_the_defaults_change_nothing checks against a run."""
    launched = []
    launch = tuning.launch

    def spy(name, kernel, grid, configs, shape_class, kwargs, *args, **kw):
        launched.append((name, tuple(sorted((k, _described(v)) for k, v in kwargs.items()))))
        return launch(name, _NoRun() if dry else kernel, grid, configs, shape_class, kwargs, *args, **kw)
    monkeypatch.setattr(tuning, "launch", spy)
    return launched


def default_launches(monkeypatch, xs) -> tuple[list, list]:
    """The launches of `run_delta_rule(xs)` with no option, from a dry run, and its (unwritten)
    outputs and gradients."""
    with monkeypatch.context() as mp:
        launched = spy_on_launches(mp, dry=True)
        results = run_delta_rule(xs)
    return launched, results


def run_delta_rule(xs, **options):
    """o, the final state and every gradient of one forward+backward (a fixed cotangent)."""
    xs = [None if x is None else x.detach().clone().requires_grad_() for x in xs]
    q, k, v, beta, g, h0 = xs
    o, ht = triton_chunk_delta_rule(q, k, v, beta, g, initial_state=h0, output_final_state=True,
                                    **options)
    do = torch.linspace(-1, 1, o.numel(), device=o.device).reshape(o.shape).to(o.dtype)
    ((o.float() * do.float()).sum() + ht.sum()).backward()
    return [o, ht] + [x.grad for x in xs]


# (option, the module switch it replaces): the patched module is what the GPU scripts ran before
SWITCHES = {
    "precision": ({"precision": "tf32x3"},
                  lambda mp: mp.setattr(delta_rule_chunk, "dot_precision", lambda dtype, K: "tf32x3")),
    "inverse_by_substitution": ({"inverse_by_squaring": False},
                                lambda mp: mp.setattr(delta_rule_chunk, "INVERSE_BY_SQUARING", False)),
    "bwd_buffers": ({"bwd_buffers": {"dd": "f32", "dh_local": "mid", "dh": "f32"}},
                    lambda mp: mp.setattr(delta_rule_chunk, "BWD_BUFFERS",
                                          {"dd": "f32", "dh_local": "mid", "dh": "f32"})),
    "fuse_output": ({"fuse_output": "both"},
                    lambda mp: mp.setattr(launch_choices, "_fuses_output", lambda cls, backward: True)),
    "overlap_output": ({"overlap_output": "both"},
                       lambda mp: mp.setattr(segment_choices, "_overlaps_output",
                                              lambda cls, NT, backward=True: NT > 1)),
    "segments": ({"segments": (2, 4)},
                 lambda mp: [mp.setattr(segment_choices, name, value) for name, value in
                             (("SEGMENTED_FORWARD", True), ("SEGMENTED_BACKWARD", True),
                              ("MIN_SEGMENT_CHUNKS", 2), ("SEGMENT_FILL", 4),
                              ("MIN_WARMUP_CHUNKS", 2), ("WARMUP_FILL", 4))]),  # gated: warm-ups
    "warmup": ({"warmup": False},
               lambda mp: [mp.setattr(segment_choices, name, False)
                           for name in ("WARMUP_FORWARD", "WARMUP_BACKWARD")]),
}


@pytest.mark.parametrize("switch", sorted(SWITCHES))
def test_each_option_launches_and_computes_what_its_patched_switch_did(monkeypatch, switch):
    # bf16 tiles (K = 64) so that every option has a path to change, few programs, a masked last
    # chunk; 5 chunks for the segments (of 3 chunks with (2, 4)), 9 for the warm-ups (2 segments
    # of at least MIN_WARMUP_CHUNKS), 2 for the rest
    options, patch = SWITCHES[switch]
    T = {"segments": 4, "warmup": 8}.get(switch, 1) * CHUNK + 7
    xs = make_inputs(1, T, 2, 64, 64, "strong", True, torch.bfloat16, case_seed())
    default_launched, default = default_launches(monkeypatch, xs)
    launched = spy_on_launches(monkeypatch)
    given = run_delta_rule(xs, **options)
    given_launches = list(launched)
    launched.clear()
    with monkeypatch.context() as mp:
        patch(mp)
        patched = run_delta_rule(xs)
    assert given_launches == launched, "the option launched otherwise than the patched module"
    assert given_launches != default_launched, "the option was ignored"
    for name, a, b in zip(("o", "ht", "dq", "dk", "dv", "dbeta", "dg", "dh0"), given, patched):
        assert torch.equal(a, b), f"{name} differs from the patched module's"
    assert len(default) == len(given)


def test_options_naming_the_defaults_change_nothing(monkeypatch):
    xs = make_inputs(1, CHUNK + 7, 2, 64, 64, "weak", True, torch.bfloat16, case_seed())
    dry, _ = default_launches(monkeypatch, xs)
    launched = spy_on_launches(monkeypatch)
    default = run_delta_rule(xs)
    ran = list(launched)
    assert dry == ran, "a dry run launched otherwise than a run"
    launched.clear()
    # at 4 programs on the CPU's assumed 132 SMs the rules fuse and overlap nothing
    named = run_delta_rule(xs, precision="bf16", inverse_by_squaring=True, fuse_output="none",
                           overlap_output="none", segments=(0, 2),
                           bwd_buffers=dict(delta_rule_chunk.BWD_BUFFERS), warmup=True)
    assert launched == ran
    for a, b in zip(default, named):
        assert torch.equal(a, b)


@pytest.mark.parametrize("options, message", [
    ({"precision": "fp8"}, "precision must be one of"),
    ({"inverse_by_squaring": 1}, "inverse_by_squaring must be"),
    ({"fuse_output": "training"}, "fuse_output must be one of"),
    ({"overlap_output": True}, "overlap_output must be one of"),
    ({"segments": (8,)}, "segments must be"),
    ({"segments": (8, 0)}, "segments must be"),
    ({"bwd_buffers": {"dq": "f32"}}, "bwd_buffers must map"),
    ({"bwd_buffers": {"dd": "bf16"}}, "bwd_buffers must map"),
    ({"warmup": "on"}, "warmup must be True, False or None"),
], ids=lambda x: x if isinstance(x, str) else "-".join(x))
def test_unknown_option_values_raise_one_line_errors(options, message):
    q = torch.randn(1, 8, 1, 32, device=DEVICE)
    beta = torch.rand(1, 8, 1, device=DEVICE)
    with pytest.raises(ValueError, match=message) as err:
        triton_chunk_delta_rule(q, q, q, beta, **options)
    assert "\n" not in str(err.value)


class KernelSpy:
    """Stands in for a Triton kernel: records each launch's grid and warps, then launches."""

    def __init__(self, kernel, launches: list):
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((tuple(grid), kwargs.get("num_warps")))
            return self.kernel[grid](*args, **kwargs)
        return launch


def run_rwkv7(xs, **options):
    xs = [None if x is None else x.detach().clone().requires_grad_() for x in xs]
    o, ht = triton_fused_recurrent_rwkv7(*xs[:6], initial_state=xs[6], output_final_state=True,
                                         **options)
    (o.float().sum() + ht.sum()).backward()
    return [o, ht] + [x.grad for x in xs]


def test_rwkv7_value_block_and_warps_launch_what_the_patched_launcher_did(monkeypatch):
    launched = []
    for name in ("_fwd_kernel", "_bwd_kernel"):
        monkeypatch.setattr(fused_recurrent, name, KernelSpy(getattr(fused_recurrent, name), launched))
    # one head: the value block and the warps change the launch per head alike
    xs = make_rwkv7_inputs(1, 40, 1, 32, 64, "strong", True, torch.float32, case_seed())
    default = run_rwkv7(xs)
    default_launches = list(launched)
    launched.clear()
    given = run_rwkv7(xs, value_block=32, num_warps=2)
    given_launches = list(launched)
    launched.clear()
    with monkeypatch.context() as mp:
        mp.setattr(fused_recurrent, "_value_block", lambda K, V: min(32, V))
        mp.setattr(fused_recurrent, "_launch_options", lambda K, V: {"num_warps": 2})
        patched = run_rwkv7(xs)
    assert given_launches == launched and given_launches != default_launches
    for a, b in zip(given, patched):
        assert torch.equal(a, b)
    named = run_rwkv7(xs, value_block=16, num_warps=4)  # the launcher's own choice at K = 32
    for a, b in zip(default, named):
        assert torch.equal(a, b)


@pytest.mark.parametrize("options", [{"value_block": 24}, {"num_warps": 3}, {"value_block": 0}],
                         ids=lambda o: "-".join(f"{k}{v}" for k, v in o.items()))
def test_rwkv7_launch_options_must_be_powers_of_two(options):
    r = torch.randn(1, 4, 1, 32, device=DEVICE)
    with pytest.raises(ValueError, match="must be a power of two") as err:
        triton_fused_recurrent_rwkv7(r, -r.abs(), r, r, r, r, **options)
    assert "\n" not in str(err.value)
