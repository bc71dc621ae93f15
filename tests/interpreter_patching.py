"""A speed-up of Triton's interpreter (TRITON_INTERPRET=1, where the kernel tests run on the CPU)
for the tests: `install()` skips the interpreter's redundant re-patching of triton.language.

The interpreter swaps triton.language's builtins for interpreted ones (`_patch_lang`: every
member of tl, tl.tensor and tl.math inspected) at each kernel launch, and restores them when the
launch ends. It patches again at every call of a @triton.jit helper inside the kernel
(`InterpretedFunction.__call__`), while the launch's own patch is still in force and that scope is
never restored: about 0.3 ms a call, tens of thousands of calls in one kernel test, for nothing,
because the modules already hold the interpreted versions. `install()` skips a helper's patch
exactly then: while a launch's patch is in force for every module the helper's patch would touch
(tl and/or tl.core, as found in the helper's globals, the interpreter's own rule). Anything else
(a launch itself, a helper whose globals name a module the launch did not patch, a helper called
outside a launch) runs the interpreter's own code, so each launch still patches and restores.

Guard: the skip is right only for the interpreter code it was checked against, so `install()`
changes nothing unless the sources it relies on hash to a digest listed in `CHECKED` (one per
Triton release read). tests/test_interpreter_patching.py fails when the skip is not in force, so
a Triton upgrade asks for the new sources to be read and their digest added here.
"""
from __future__ import annotations

import hashlib
import inspect
import sys
import threading
from types import ModuleType

# the interpreter's pieces the skip's correctness rests on: how a patch is made, recorded and
# restored, which modules it patches, and who calls it (the launch restores; a helper does not)
SOURCES = ("_LangPatchScope", "_patch_attr", "_patch_builtin", "_patch_lang_tensor",
           "_patch_reduce_scan", "_patch_lang_core", "_patch_lang", "GridExecutor.__call__",
           "InterpretedFunction.__call__")

# sha256 of those sources (`sources_digest`), per Triton release whose interpreter was read
CHECKED = {
    "3.7.1": "efb203ef5008bfc1d89a99f70bf111bb4f9c365bfc81f71d674ebf0086a91c38",
    "3.9.0": "da7fc9eb04251d4e46da1a15d8de8d529eb0abfe30c246d581f97028916da5fe",
}

_MARK = "_ltm_skips_nested_patches"


def sources_digest(interpreter: ModuleType) -> str | None:
    """sha256 of SOURCES in `interpreter`, or None where one is missing."""
    digest = hashlib.sha256()
    for name in SOURCES:
        obj = interpreter
        for part in name.split("."):
            obj = getattr(obj, part, None)
        try:
            digest.update(inspect.getsource(obj).encode())
        except (TypeError, OSError):
            return None
    return digest.hexdigest()


def _patched_modules(interpreter: ModuleType, fn) -> frozenset:
    """The modules `_patch_lang(fn)` patches: tl and tl.core where fn's globals hold them."""
    tl = interpreter.tl
    return frozenset(value for value in fn.__globals__.values()
                     if inspect.ismodule(value) and value in [tl, tl.core])


class _LaunchScope:
    """A launch's patch scope, with the modules patched while it is in force: the launch's own,
    and those a helper's patch adds during the launch (nothing restores either before the launch
    does)."""

    def __init__(self, scope, modules: frozenset, in_force: list) -> None:
        self._scope, self.modules, self._in_force = scope, set(modules), in_force
        in_force.append(self)

    def restore(self) -> None:
        try:
            self._scope.restore()
        finally:
            self._in_force[:] = [launch for launch in self._in_force if launch is not self]


def _skipping(interpreter: ModuleType, patch_lang):
    """`patch_lang` that a helper called inside a launch skips when every module its patch would
    touch has been patched since the launch started."""
    launch_code = interpreter.GridExecutor.__call__.__code__
    # the launches in progress, per thread: a helper skips only what its own thread's launch did
    local = threading.local()

    def _patch_lang(fn):
        in_force = local.__dict__.setdefault("launches", [])
        if sys._getframe(1).f_code is launch_code:
            return _LaunchScope(patch_lang(fn), _patched_modules(interpreter, fn), in_force)
        if not in_force:
            return patch_lang(fn)
        modules = _patched_modules(interpreter, fn)
        # empty: the interpreter's own call raises its "must be visible" error
        if modules and any(modules <= launch.modules for launch in in_force):
            return interpreter._LangPatchScope()  # nothing changed, nothing to restore
        # tl.standard's helpers see tl.core as well as tl (the interpreter puts its own tl into
        # every rewritten function's globals): their first call patches tl.core, after which it
        # stays patched until the launch restores (tl.core's module attributes even after)
        scope = patch_lang(fn)
        in_force[-1].modules |= modules
        return scope

    setattr(_patch_lang, _MARK, patch_lang)
    return _patch_lang


def installed(interpreter: ModuleType | None = None) -> bool:
    """Whether the skip is in force in `interpreter` (Triton's, by default)."""
    if interpreter is None:
        from triton.runtime import interpreter
    return hasattr(getattr(interpreter, "_patch_lang", None), _MARK)


def install(interpreter: ModuleType | None = None) -> bool:
    """Skip a jit helper's redundant patch inside a launch in `interpreter` (Triton's, by default);
    True where the skip is in force afterwards. Changes nothing unless the interpreter's sources
    are ones listed in CHECKED; a second call changes nothing either."""
    if interpreter is None:
        try:
            from triton.runtime import interpreter
        except ImportError:
            return False
    if installed(interpreter):
        return True
    if sources_digest(interpreter) not in CHECKED.values():
        return False
    interpreter._patch_lang = _skipping(interpreter, interpreter._patch_lang)
    return True
