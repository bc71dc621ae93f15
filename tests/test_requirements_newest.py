"""`make test-newest` runs tests/kernels and tests/ops in a second virtualenv that installs only
requirements-newest.txt: every third-party package those tests reach must be pinned there.

CI failed once on this (ModuleNotFoundError: tokenizers), after 56 minutes: a kernel test built its
models through ltm.train, whose settings import the token cache and with it the tokenizer. Walked
statically: a test file's imports wherever they stand (a test function runs them), an ltm module's
imports at module level (they run when it loads); a module's lazy imports inside functions are left
out, as the tests that reach them install or skip on their own.
"""
from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

from tests.test_imports import MODULES, every_import

ROOT = Path(__file__).resolve().parents[1]
SUITES = ("tests/kernels", "tests/ops")


def pinned(requirements: Path) -> set[str]:
    """Normalised distribution names a requirements file pins."""
    names = set()
    for line in requirements.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            names.add(normalise(re.split(r"[<>=!~;\[ ]", line, maxsplit=1)[0]))
    return names


def normalise(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def own_module(name: str, importer: Path) -> Path | None:
    """The file of an import that is the project's own: ltm (kernels/ included) or a test module,
    by package name or by bare name beside the importer (pytest puts a test's folder on the path)."""
    if name in MODULES:
        return MODULES[name]
    for base in (ROOT, importer.parent, ROOT / "tests"):
        for candidate in (base / f"{name.replace('.', '/')}.py", base / name.replace(".", "/") / "__init__.py"):
            if candidate.exists():
                return candidate
    return None


def third_party_reached(start: list[Path]) -> dict[str, str]:
    """{top-level module: the project file that imports it} over everything the start files
    reach: all imports of a test file, module-level imports of each project module it loads."""
    found: dict[str, str] = {}
    stack = [(path, True) for path in start]
    seen: set[Path] = set()
    while stack:
        path, a_test = stack.pop()
        if path in seen:
            continue
        seen.add(path)
        package = ".".join(path.relative_to(ROOT).parent.parts)
        for module, name, inside in every_import(path, package):
            imported = module if name is None else f"{module}.{name}"
            if inside and not a_test:
                continue
            parts = imported.split(".")
            packages = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
            files = [f for f in (own_module(p, path) for p in packages) if f is not None]
            if files:
                stack.extend((f, f.is_relative_to(ROOT / "tests") and f.name.startswith("test_"))
                             for f in files)
            elif parts[0] not in sys.stdlib_module_names:
                found.setdefault(parts[0], str(path.relative_to(ROOT)))
    return found


def distributions_of(module: str) -> set[str]:
    return {normalise(d) for d in importlib.metadata.packages_distributions().get(module, [module])}


def test_the_newest_suite_reaches_only_pinned_packages():
    start = [ROOT / "tests/conftest.py"]
    for suite in SUITES:
        start += sorted((ROOT / suite).rglob("*.py"))
    have = pinned(ROOT / "requirements-newest.txt")
    missing = {module: importer for module, importer in third_party_reached(start).items()
               if not distributions_of(module) & have}
    assert not missing, ("requirements-newest.txt lacks what the newest suite imports: "
                         + ", ".join(f"{m} (imported by {f})" for m, f in sorted(missing.items())))


def test_the_walk_follows_a_test_into_the_package(tmp_path):
    # the import that failed CI: a test function imports ltm.train.fused_ops, which loads the
    # tokenizer through ltm.train.settings and ltm.data.cache
    reached = third_party_reached([ROOT / "tests/kernels/test_kernels_launch_arguments.py"])
    assert {"tokenizers", "torch", "pytest"} <= set(reached)
    assert reached["tokenizers"] == "ltm/data/tokenizer.py"
    assert "tokenizers" not in third_party_reached([ROOT / "tests/kernels/test_kernels_common.py"])
