"""The op entry points (`ltm.ops.delta_rule.delta_rule` / `delta_rule_one_token`, `ltm.ops.rwkv7.rwkv7`
/ `rwkv7_one_token`): each kernel name reaches its own implementation, the implementations agree
on odd sizes with T no multiple of any chunk, and an unknown name is a one-line error."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

import pytest
import torch
import torch.nn.functional as F

import ltm.ops.delta_rule as delta_rule_op
import ltm.ops.rwkv7 as rwkv7_op
from ltm.ops import KERNELS
from reference import DEVICE, case_seed, rel_err

# B, T, H, K, V: T = 37 is no multiple of the torch chunk below (16) nor of the Triton chunks
# (64 for the delta rule, 16 for RWKV-7); no size is a power of two
B, T, H, K, V = 2, 37, 3, 24, 20
CHUNK_SIZE = 16
# float32 against float32: the bound of the float32 comparisons in tests/ops and tests/kernels
BOUND = 1e-4
# fla's Triton kernels multiply float32 tiles in TF32 (a 10-bit mantissa): on an H100 (fla-core
# 0.6.0, Triton 3.6) its outputs here were 1.18e-3 (delta rule) and 7.75e-4 (RWKV-7) off the token
# loop's, so its bound is TF32's
BOUNDS = {"fla": 3e-3}
# the "fla" path's module and function per entry point (fla is optional; a stand-in is used)
FLA = {"delta_rule": ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),
       "rwkv7": ("fla.ops.rwkv7", "chunk_rwkv7")}


def delta_rule_inputs(seed: int, T: int = T) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {"q": torch.randn(B, T, H, K, generator=gen),
            "k": F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1),
            "v": torch.randn(B, T, H, V, generator=gen),
            "beta": torch.rand(B, T, H, generator=gen),
            "g": -torch.rand(B, T, H, generator=gen)}


def rwkv7_inputs(seed: int, T: int = T) -> dict:
    gen = torch.Generator().manual_seed(seed)
    kk = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    return {"r": torch.randn(B, T, H, K, generator=gen),
            "w": -torch.rand(B, T, H, K, generator=gen),
            "k": 0.5 * torch.randn(B, T, H, K, generator=gen),
            "v": torch.randn(B, T, H, V, generator=gen),
            "a": -kk, "b": kk * torch.rand(B, T, H, K, generator=gen)}


def state(seed: int) -> torch.Tensor:
    return torch.randn(B, H, K, V, generator=torch.Generator().manual_seed(seed + 1))


def one_token(inputs: dict) -> dict:
    return {name: x[:, 0] for name, x in inputs.items()}


class Spy:
    """Stands in for an implementation: records its calls and returns a (1, 1) zero output (the
    one-token form of "naive" takes token 0 of it) and no state."""

    def __init__(self, name: str):
        self.name, self.calls = name, []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return torch.zeros(1, 1), None


def install_fake_fla(monkeypatch, module: str, function: str) -> Spy:
    """Make `import fla...` find a stand-in module whose `function` is a Spy."""
    spy = Spy("fla")
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        fake = types.ModuleType(name)
        # importlib.util.find_spec (check_kernel) reads the spec of a module already imported
        fake.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=i < len(parts))
        fake.__path__ = []
        monkeypatch.setitem(sys.modules, name, fake)
        if i > 1:
            monkeypatch.setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], fake, raising=False)
    monkeypatch.setattr(sys.modules[module], function, spy, raising=False)
    return spy


def spies_for(op: str, monkeypatch) -> dict[str, dict[str, Spy]]:
    """kernel -> {entry point: the Spy that should be called}, with every implementation replaced."""
    import ltm.kernels.delta_rule as triton_delta_rule
    import ltm.kernels.rwkv7 as triton_rwkv7
    if op == "delta_rule":
        names = {"naive": (delta_rule_op, "naive_delta_rule"), "torch": (delta_rule_op, "chunk_delta_rule"),
                 "step": (delta_rule_op, "delta_rule_step"),
                 "triton": (triton_delta_rule, "triton_chunk_delta_rule"),
                 "triton_step": (triton_delta_rule, "triton_delta_rule_step")}
    else:
        names = {"naive": (rwkv7_op, "naive_rwkv7"), "torch": (rwkv7_op, "chunk_rwkv7"),
                 "step": (rwkv7_op, "rwkv7_step"), "triton": (triton_rwkv7, "triton_chunk_rwkv7"),
                 "triton_step": (triton_rwkv7, "triton_rwkv7_step")}
    spies = {}
    for key, (module, name) in names.items():
        spies[key] = Spy(name)
        monkeypatch.setattr(module, name, spies[key])
    fla = install_fake_fla(monkeypatch, *FLA[op])
    # the sequence form, then the one-token form, for each kernel
    return {"naive": (spies["naive"], spies["naive"]), "torch": (spies["torch"], spies["step"]),
            "triton": (spies["triton"], spies["triton_step"]), "fla": (fla, spies["step"])}


def entry_points(op: str):
    if op == "delta_rule":
        return delta_rule_op.delta_rule, delta_rule_op.delta_rule_one_token, delta_rule_inputs
    return rwkv7_op.rwkv7, rwkv7_op.rwkv7_one_token, rwkv7_inputs


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("op", ["delta_rule", "rwkv7"])
def test_each_kernel_routes_to_its_implementation(op, kernel, monkeypatch):
    sequence, step, make = entry_points(op)
    expected_sequence, expected_step = spies_for(op, monkeypatch)[kernel]
    x = make(0, T=5)
    sequence(*x.values(), kernel=kernel, chunk_size=CHUNK_SIZE, initial_state=state(0),
             output_final_state=True)
    assert len(expected_sequence.calls) == 1, f"{op} sequence, {kernel}: not {expected_sequence.name}"
    if kernel == "naive":
        # the one-token form of the reference is the token loop over one token
        expected_sequence.calls.clear()
    step(*one_token(x).values(), state(0), kernel=kernel)
    assert len(expected_step.calls) == 1, f"{op} one token, {kernel}: not {expected_step.name}"


@pytest.mark.parametrize("chunk_size,head_dim,device,used", [
    (2, 16, "cpu", 2), (64, 16, "cpu", 4), (64, 17, "cpu", 8), (64, 64, "cpu", 8),
    (8, 64, "cuda", 8), (64, 64, "cuda", 16)])
def test_the_torch_rwkv7_chunk_is_capped(chunk_size, head_dim, device, used):
    assert rwkv7_op.torch_chunk_size(chunk_size, head_dim, torch.device(device)) == used


def test_the_torch_rwkv7_takes_the_capped_chunk(monkeypatch):
    spy = spies_for("rwkv7", monkeypatch)["torch"][0]
    x = rwkv7_inputs(0, T=5)
    rwkv7_op.rwkv7(*x.values(), kernel="torch", chunk_size=64)
    assert spy.calls[0][1]["chunk_size"] == rwkv7_op.torch_chunk_size(
        64, x["r"].shape[-1], x["r"].device) < 64


def test_the_torch_delta_rule_takes_the_chunk_size(monkeypatch):
    spy = spies_for("delta_rule", monkeypatch)["torch"][0]
    delta_rule_op.delta_rule(*delta_rule_inputs(0, T=5).values(), kernel="torch", chunk_size=7)
    assert spy.calls[0][1]["chunk_size"] == 7


def test_fla_receives_its_own_argument_names(monkeypatch):
    """fla takes g before beta (by name here) and, for RWKV-7, scale 1 (no extra scale on r)."""
    fla = spies_for("delta_rule", monkeypatch)["fla"][0]
    x = delta_rule_inputs(0, T=5)
    delta_rule_op.delta_rule(*x.values(), kernel="fla", chunk_size=CHUNK_SIZE)
    kwargs = fla.calls[0][1]
    assert kwargs["g"] is x["g"] and torch.equal(kwargs["beta"], x["beta"])
    fla = spies_for("rwkv7", monkeypatch)["fla"][0]
    rwkv7_op.rwkv7(*rwkv7_inputs(0, T=5).values(), kernel="fla", chunk_size=CHUNK_SIZE)
    assert fla.calls[0][1]["scale"] == 1.0


def available_kernels() -> list[str]:
    # fla runs on a GPU only, and only where it is installed
    fla = importlib.util.find_spec("fla") is not None and DEVICE.type == "cuda"
    return [k for k in KERNELS if k != "fla" or fla]


@pytest.mark.parametrize("op", ["delta_rule", "rwkv7"])
def test_every_kernel_agrees_with_the_reference(op):
    seed = case_seed()
    sequence, step, make = entry_points(op)
    x = {n: t.to(DEVICE) for n, t in make(seed).items()}
    h0 = state(seed).to(DEVICE)
    o_ref, s_ref = sequence(*x.values(), kernel="naive", chunk_size=CHUNK_SIZE, initial_state=h0,
                            output_final_state=True)
    o1_ref, s1_ref = step(*one_token(x).values(), h0, kernel="naive")
    for kernel in available_kernels():
        bound = BOUNDS.get(kernel, BOUND)
        o, s = sequence(*x.values(), kernel=kernel, chunk_size=CHUNK_SIZE, initial_state=h0,
                        output_final_state=True)
        assert rel_err(o, o_ref) <= bound, f"seed={seed}: {op} {kernel} o {rel_err(o, o_ref):.2e}"
        assert rel_err(s, s_ref) <= bound, f"seed={seed}: {op} {kernel} state {rel_err(s, s_ref):.2e}"
        o1, s1 = step(*one_token(x).values(), h0, kernel=kernel)
        assert rel_err(o1, o1_ref) <= bound, f"seed={seed}: {op} {kernel} one-token o"
        assert rel_err(s1, s1_ref) <= bound, f"seed={seed}: {op} {kernel} one-token state"


@pytest.mark.parametrize("op", ["delta_rule", "rwkv7"])
def test_unknown_kernel_is_one_line(op):
    sequence, step, make = entry_points(op)
    x = make(0, T=3)
    with pytest.raises(ValueError, match=r"^kernel: unknown kernel 'cuda', expected one of") as info:
        sequence(*x.values(), kernel="cuda", chunk_size=CHUNK_SIZE)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=r"^kernel: unknown kernel 'cuda', expected one of") as info:
        step(*one_token(x).values(), None, kernel="cuda")
    assert "\n" not in str(info.value)
