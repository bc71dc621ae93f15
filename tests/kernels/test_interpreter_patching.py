"""tests/interpreter_patching.py, the skip of the interpreter's redundant re-patching: in force on
the pinned Triton, still patching and restoring at every launch, still computing right, and
changing nothing on an interpreter it was not checked against."""
import os
import types

import pytest
import torch

from tests import interpreter_patching

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="patches Triton's interpreter only")
triton = pytest.importorskip("triton")  # Linux x86-64 only
tl = pytest.importorskip("triton.language")


@triton.jit
def _add_one(x):
    return x + 1


@triton.jit
def _kernel(x_ptr, out_ptr, N: tl.constexpr, REPEATS: tl.constexpr):
    # a helper of this module (tl in its globals) REPEATS times, then one of tl.standard's (tl and
    # tl.core in its globals, as the interpreter leaves them) twice
    offsets = tl.arange(0, N)
    x = tl.load(x_ptr + offsets)
    for _ in tl.static_range(REPEATS):
        x = _add_one(x)
    x = tl.cumsum(tl.cumsum(x, 0), 0)
    tl.store(out_ptr + offsets, x)


def _launch(repeats: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.arange(8, dtype=torch.float32)
    out = torch.full_like(x, float("nan"))
    _kernel[(1,)](x, out, N=8, REPEATS=repeats)
    return out, (x + repeats).cumsum(0).cumsum(0)


@pytest.fixture
def patch_counts(monkeypatch) -> list:
    """One entry per module the interpreter patches (`_patch_builtin` calls), from here on."""
    from triton.runtime import interpreter
    # a first launch rewrites tl.standard's helpers, which puts tl into their globals: until then
    # their patch touches tl.core only, so the first launch of a process patches less than later ones
    _launch(1)
    calls = []
    patch_builtin = interpreter._patch_builtin
    monkeypatch.setattr(interpreter, "_patch_builtin",
                        lambda *args, **kwargs: calls.append(args[0]) or patch_builtin(*args, **kwargs))
    return calls


def test_in_force_on_this_triton():
    from triton.runtime import interpreter
    assert interpreter_patching.installed(), (
        f"the skip is not in force on Triton {triton.__version__}: read its interpreter against "
        f"tests/interpreter_patching.py and list the digest of its sources in CHECKED")
    assert interpreter_patching.install(), "a second install() keeps it"
    wrapped = getattr(interpreter._patch_lang, interpreter_patching._MARK)
    assert not hasattr(wrapped, interpreter_patching._MARK), "installed twice over"


def test_helper_calls_inside_a_launch_patch_nothing(patch_counts):
    out, expected = _launch(1)
    once = len(patch_counts)
    assert once > 0, "the launch patches triton.language itself"
    patch_counts.clear()
    out, expected = _launch(9)
    assert torch.equal(out, expected)
    assert len(patch_counts) == once, "eight more helper calls patched triton.language again"


def test_each_launch_still_patches_and_restores(patch_counts):
    names = ("load", "store", "arange", "cumsum", "static_range", "reduce", "associative_scan")
    before = {name: getattr(tl, name) for name in names}
    tensor_attrs = ("__index__", "__bool__", "T")
    tensor_before = {name: vars(tl.tensor).get(name) for name in tensor_attrs}
    for _ in range(2):
        out, expected = _launch(3)
        assert torch.equal(out, expected)
        assert {name: getattr(tl, name) for name in names} == before
        assert {name: vars(tl.tensor).get(name) for name in tensor_attrs} == tensor_before
    first, second = patch_counts[:len(patch_counts) // 2], patch_counts[len(patch_counts) // 2:]
    assert first and first == second, "the second launch patched what the first did"


def test_changes_nothing_on_other_interpreter_sources(monkeypatch):
    from triton.runtime import interpreter

    def _patch_lang(fn):
        return None
    other = types.ModuleType("other_interpreter")
    other._patch_lang = _patch_lang
    assert not interpreter_patching.install(other) and other._patch_lang is _patch_lang
    # the running interpreter's own pieces, its sources taken off the list
    fresh = types.ModuleType("fresh_interpreter")
    for name in interpreter_patching.SOURCES:
        setattr(fresh, name.split(".")[0], getattr(interpreter, name.split(".")[0]))
    ours = interpreter._patch_lang
    patch_lang = fresh._patch_lang = getattr(ours, interpreter_patching._MARK, ours)
    assert interpreter_patching.sources_digest(fresh) in interpreter_patching.CHECKED.values()
    monkeypatch.setattr(interpreter_patching, "CHECKED", {})
    assert not interpreter_patching.install(fresh) and fresh._patch_lang is patch_lang
