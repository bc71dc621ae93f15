"""The import graph of every `ltm` module: no circle, no import from a lower layer up, and no `ltm`
import tucked into a function to dodge one.

The layers, lowest first: a module may import only from its own layer or the ones below it.
Function-level imports count as edges too (they run as surely as module-level ones, only later);
so do imports under `if TYPE_CHECKING:`. The only `ltm` imports allowed inside a function are
of the Triton kernels (`ltm.kernels`, and `ltm.train.fused_ops` which holds Triton kernels of its
own): Triton is optional where it has no wheel, and its interpreter switch (TRITON_INTERPRET) must
be set before a kernel module is imported.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = [
    ("ltm", "ltm.params", "ltm.pipeline", "ltm.notebook", "ltm.lab"),
    ("ltm.ops", "ltm.kernels"),
    ("ltm.model",),
    ("ltm.data",),
    ("ltm.latent",),
    ("ltm.train",),
    ("ltm.study",),
    ("ltm.ablation", "ltm.generate"),
    ("ltm.bench",),
    ("ltm.report",),
    ("ltm.stages",),
]
LAZY_ALLOWED = ("ltm.kernels", "ltm.train.fused_ops")


def module_files() -> dict[str, Path]:
    """Every module of the package (ltm.kernels is the kernels/ folder), by dotted name."""
    found = {}
    for base, prefix in ((ROOT / "ltm", "ltm"), (ROOT / "kernels", "ltm.kernels")):
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([prefix, *parts])] = path
    return found


MODULES = module_files()


def every_import(path: Path, package: str) -> list[tuple[str, str | None, bool]]:
    """(module, name imported from it or None, inside a function) of every import in the file;
    a relative import is resolved against `package`, the dotted package the file is in."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend((alias.name, None, inside) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                found.extend((base, alias.name, inside) for alias in child.names)
            visit(child, inside)

    visit(ast.parse(path.read_text()), False)
    return found


def imports_of(name: str, path: Path) -> list[tuple[str, bool]]:
    """(imported ltm module, inside a function) for every import in the file. `from a.b import c`
    imports the module a.b.c where there is one, else a.b; a relative import is resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for module, imported, inside in every_import(path, package):
        sub = f"{module}.{imported}"
        found.append((sub if imported is not None and sub in MODULES else module, inside))
    return [(target, inside) for target, inside in found if target in MODULES and target != name]


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}


def layer_of(name: str) -> int:
    best, rank = None, -1
    for i, layer in enumerate(LAYERS):
        for prefix in layer:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > rank:
                best, rank = i, len(prefix)
    assert best is not None, f"{name}: in no layer of tests/test_imports.py"
    return best


def find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """One cycle of the directed graph as a list of nodes (first = last), or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := walk(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := walk(node)):
            return cycle
    return None


def test_no_import_cycle():
    graph = {name: sorted({t for t, _ in edges}) for name, edges in GRAPH.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_from_a_lower_layer_up():
    upward = [f"{name} -> {target}" for name, edges in GRAPH.items() for target, _ in edges
              if layer_of(target) > layer_of(name)]
    assert not upward, "imports from a lower layer up: " + ", ".join(sorted(set(upward)))


def test_no_ltm_import_tucked_into_a_function():
    tucked = [f"{name} -> {target}" for name, edges in GRAPH.items() for target, inside in edges
              if inside and not target.startswith(LAZY_ALLOWED)]
    assert not tucked, "ltm imports inside functions: " + ", ".join(sorted(set(tucked)))


def test_every_module_has_a_layer():
    for name in MODULES:
        layer_of(name)


def test_the_checker_finds_cycles_and_tucked_imports(tmp_path):
    """The checker itself: a two-module circle, a self-free chain, and a function-level import."""
    assert find_cycle({"a": ["b"], "b": ["a"]}) in (["a", "b", "a"], ["b", "a", "b"])
    assert find_cycle({"a": ["b"], "b": ["c"], "c": []}) is None
    module = tmp_path / "m.py"
    module.write_text("import ltm.params\n\ndef f():\n    from ltm.model.lm import LTM\n")
    assert imports_of("ltm.stages.m", module) == [("ltm.params", False), ("ltm.model.lm", True)]
    with pytest.raises(AssertionError):
        layer_of("json")


def test_test_files_have_unique_basenames():
    """pytest imports test modules by basename (no packages under tests/): two files of one name
    stop the whole collection, as tests/stages/test_recall.py beside tests/data/test_recall.py did."""
    import collections
    names = collections.Counter(p.name for p in Path(__file__).resolve().parent.rglob("test_*.py"))
    assert not [n for n, k in names.items() if k > 1]


def test_every_package_is_listed_for_installation():
    # a package missing from pyproject.toml's list works in the editable install and is absent
    # from a wheel (ltm.study was)
    import tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    assert found == listed, f"packages not listed: {sorted(found - listed)}; listed, not found: {sorted(listed - found)}"
