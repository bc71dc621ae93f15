"""Every Triton kernel is launched with all its arguments named, and declares no default.

torch.compile launches a user kernel with exactly the arguments the launch passed: one left to its
default made the compiled DeltaNet backward fail on every GPU ("launcher() missing 3 required
positional arguments", H200, torch 2.11), while eager launches and the CPU interpreter accepted
it. Two checks: the kernels' source (no parameter has a default) and the launches themselves,
recorded through each mixer's forward and backward with `kernel: triton` and through the delta
rule's forced alternative passes (segments, fused and overlapped outputs).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from tests.tiny_models import tiny

ROOT = Path(__file__).resolve().parents[2]
# launch options Triton takes beside the kernel's own parameters
LAUNCH_OPTIONS = {"num_warps", "num_stages", "num_ctas", "maxnreg", "warmup", "grid"}


def jit_functions(source: str):
    """(name, node) of every function decorated with triton.jit (or `jit`) in a module's source."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and any(
                ast.unparse(d).split("(")[0].split(".")[-1] == "jit" for d in node.decorator_list):
            yield node.name, node


def test_no_triton_kernel_declares_a_default():
    with_defaults = []
    for path in sorted([*ROOT.joinpath("kernels").rglob("*.py"), *ROOT.joinpath("ltm").rglob("*.py")]):
        for name, node in jit_functions(path.read_text()):
            if node.args.defaults or any(d is not None for d in node.args.kw_defaults):
                with_defaults.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert not with_defaults, f"Triton kernels with default-valued parameters: {with_defaults}"


def test_the_source_check_finds_a_default():
    source = "@triton.jit\ndef k(x, N: tl.constexpr, MODE: tl.constexpr = 0):\n    pass\n"
    (name, node), = jit_functions(source)
    assert name == "k" and len(node.args.defaults) == 1


def record_launches(run) -> list[tuple[str, set, set]]:
    """(kernel name, its parameters, the names a launch passed) of every launch of one of our
    kernels during `run()`; the kernels still execute (through the interpreter on a CPU)."""
    from triton.runtime.jit import JITFunction
    classes = [JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction
        classes.append(InterpretedFunction)
    except ImportError:
        pass
    launches, originals = [], {cls: cls.run for cls in classes}

    def recording(original):
        def run_and_record(self, *args, **kwargs):
            fn = getattr(self, "fn", None)
            module = getattr(fn, "__module__", "") or ""
            names = list(getattr(self, "arg_names", []))
            if module.startswith("ltm") and names:
                passed = set(names[:len(args)]) | (set(kwargs) - LAUNCH_OPTIONS)
                launches.append((fn.__name__, set(names), passed))
            return original(self, *args, **kwargs)
        return run_and_record

    for cls, original in originals.items():
        cls.run = recording(original)
    try:
        run()
    finally:
        for cls, original in originals.items():
            cls.run = original
    return launches


def omitted(launches) -> list[str]:
    return sorted({f"{name}: {sorted(params - passed)}" for name, params, passed in launches
                   if params - passed})


def test_the_launch_check_finds_an_omitted_argument():
    import triton
    import triton.language as tl

    @triton.jit
    def _copy(x, y, N: tl.constexpr, SCALE: tl.constexpr = 1):
        tl.store(y + tl.arange(0, N), tl.load(x + tl.arange(0, N)) * SCALE)

    _copy.fn.__module__ = "ltm.test_probe"
    x = torch.arange(4.0)
    launches = record_launches(lambda: _copy[(1,)](x, torch.empty_like(x), N=4))
    assert omitted(launches) == ["_copy: ['SCALE']"]


MODELS = {
    "deltanet": dict(mixer="deltanet"),
    "deltanet-hier-dual": dict(mixer="deltanet", hierarchical=True, hier_op="dual"),
    "rwkv7": dict(mixer="rwkv7"),
    "titans": dict(mixer="titans", titans_depth=1, titans_chunk_size=16, titans_window=8),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_launch_of_a_triton_model_names_every_argument(name):
    from ltm.train.fused_ops import apply_fused_ops
    model = tiny(MODELS[name], kernel="triton", chunk_size=16).train()
    apply_fused_ops(model, ["rms_norm", "swiglu"])
    x = torch.randint(0, 37, (1, 21))  # one sequence: the arguments launches name, not the batch

    def step():
        loss = model(x[:, :-1], x[:, 1:])[1]
        loss.backward()
    launches = record_launches(step)
    assert launches, "no Triton kernel launched: the test no longer sees the Triton path"
    assert not omitted(launches), omitted(launches)


def test_every_launch_of_the_delta_rule_passes_names_every_argument():
    """The forward and backward by segments, the fused and the overlapped outputs (off by default,
    forced here), beside the default passes."""
    from ltm.kernels.delta_rule import chunk, launch_choices, segment_choices
    B, T, H, K = 1, 70, 2, 16
    q, k, v = (torch.randn(B, T, H, K) for _ in range(3))
    k = torch.nn.functional.normalize(k, dim=-1)
    beta, g, h0 = torch.rand(B, T, H), -torch.rand(B, T, H) * 0.1, torch.randn(B, H, K, K)

    def passes():
        for options in (chunk._Options(), chunk._Options(segments=(1, 8))):
            o, ht, saved = chunk._delta_rule_fwd(q, k, v, beta, g, K ** -0.5, h0, True, options=options)
            chunk._delta_rule_bwd(q, k, v, beta, K ** -0.5, h0, saved, torch.randn_like(o),
                                  torch.randn_like(ht), options=options)
        fuses, overlaps = launch_choices._fuses_output, segment_choices._overlaps_output
        try:
            launch_choices._fuses_output = lambda *a, **kw: True
            chunk._delta_rule_fwd(q, k, v, beta, g, K ** -0.5, h0, True, backward=False)
            launch_choices._fuses_output = fuses
            segment_choices._overlaps_output = lambda *a, **kw: True
            chunk._delta_rule_fwd(q, k, v, beta, g, K ** -0.5, h0, True)
        finally:
            launch_choices._fuses_output, segment_choices._overlaps_output = fuses, overlaps
    launches = record_launches(passes)
    kernels = {name for name, _, _ in launches}
    assert {"_bwd_state_kernel", "_segment_states_kernel", "_fwd_kernel"} <= kernels, kernels
    assert not omitted(launches), omitted(launches)
