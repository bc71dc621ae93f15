"""dvc.yaml is exact: a stage re-runs whenever something it runs changes.

For each stage, every file of this repository that its notebook imports (directly, through other
`ltm` modules, or lazily inside a function) must lie within the stage's `deps`, and every section
of params.yaml that this code names must be within its `params`. A stale result served as fresh
is the one failure a workbook that compares metrics across commits must never have.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml
from dvc.dependency.param import ParamsDependency
from dvc.repo import Repo

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = set(yaml.safe_load((ROOT / "params.yaml").read_text()))


def dvc_stages() -> dict[str, dict]:
    """Each stage as DVC itself resolves it (${...} filled in): cmd, deps and params keys."""
    stages = {}
    for stage in Repo(str(ROOT)).index.stages:
        deps = [d.def_path for d in stage.deps if not isinstance(d, ParamsDependency)]
        params = [key for d in stage.deps if isinstance(d, ParamsDependency) for key in d.params]
        stages[stage.name] = {"cmd": stage.cmd, "deps": deps, "params": params}
    return stages


STAGES = dvc_stages()


def module_file(name: str) -> Path | None:
    """The file of module `name` inside this repository (ltm.kernels is the kernels/ folder)."""
    parts = name.split(".")
    if parts[0] != "ltm":
        return None
    if parts[1:2] == ["kernels"]:
        folder = ROOT.joinpath("kernels", *parts[2:])
    else:
        folder = ROOT.joinpath("ltm", *parts[1:])
    if len(parts) > 1 and folder.with_suffix(".py").is_file():
        return folder.with_suffix(".py")
    return folder / "__init__.py" if (folder / "__init__.py").is_file() else None


def imported_modules(path: Path) -> set[str]:
    """Every `ltm` module that `path` imports anywhere, with the packages above it (importing
    ltm.ops.rwkv7 runs ltm/__init__.py and ltm/ops/__init__.py first)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from ltm.ops import delta_rule` may import a submodule
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            parts = name.split(".")
            found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {name for name in found if module_file(name) is not None}


def import_closure(notebook: Path) -> set[Path]:
    """The notebook and every repository file it runs through imports."""
    seen, todo = {notebook}, [notebook]
    while todo:
        for name in imported_modules(todo.pop()):
            path = module_file(name)
            if path not in seen:
                seen.add(path)
                todo.append(path)
    return seen


def _section_literals(nodes) -> set[str]:
    return {n.value for node in nodes for n in ast.walk(node)
            if isinstance(n, ast.Constant) and n.value in SECTIONS}


def read_sections(paths: set[Path]) -> set[str]:
    """Sections of params.yaml that the code reads: `load_section(cls, "x", ...)`,
    `params.get("x")` and `params["x"]` (any name holding "params"); a `params.get(name)` with a
    computed name reads every section named in its function or in the module's constants
    (ablate's SWITCHABLE, the report's settings loop)."""
    found = set()
    for path in paths:
        tree = ast.parse(path.read_text())
        constants = [node.value for node in tree.body if isinstance(node, ast.Assign)]
        scopes = [tree] + [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        for scope in scopes:
            for node in ast.walk(scope):
                if isinstance(node, ast.Call):
                    func = node.func
                    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                    if name == "load_section":
                        found |= _section_literals(node.args[1:2])
                    elif name == "get" and "params" in ast.unparse(func.value) and node.args:
                        computed = not isinstance(node.args[0], ast.Constant)
                        named_here = constants + ([scope] if scope is not tree else [])
                        found |= _section_literals(named_here if computed else node.args[:1])
                elif isinstance(node, ast.Subscript) and "params" in ast.unparse(node.value):
                    found |= _section_literals([node.slice])
    return found


def stage_notebook(stage: dict) -> Path:
    match = re.search(r"notebooks/\S+\.py", stage["cmd"])
    assert match, f"no notebook in {stage['cmd']!r}"
    return ROOT / match.group(0)


def covered(path: Path, deps: list[str]) -> bool:
    rel = path.relative_to(ROOT)
    return any(rel == Path(dep) or Path(dep) in rel.parents for dep in deps)


@pytest.mark.parametrize("name", sorted(STAGES))
def test_every_imported_file_is_a_dependency(name):
    stage = STAGES[name]
    closure = import_closure(stage_notebook(stage))
    # the runner that executes the notebook is code of the stage too
    closure |= import_closure(ROOT / "ltm" / "notebook.py")
    missing = sorted(str(p.relative_to(ROOT)) for p in closure if not covered(p, stage["deps"]))
    assert not missing, f"stage {name}: imports files that are not in its deps: {missing}"


@pytest.mark.parametrize("name", sorted(STAGES))
def test_every_section_the_code_reads_is_a_parameter(name):
    stage = STAGES[name]
    closure = import_closure(stage_notebook(stage))
    listed = {str(p).split(".")[0] for p in stage.get("params", [])}
    missing = sorted(read_sections(closure) - listed)
    assert not missing, f"stage {name}: reads params sections not in its params: {missing}"


def test_the_closure_follows_lazy_and_package_imports(tmp_path):
    """The checker itself: an import inside a function and the packages above a module count."""
    notebook = tmp_path / "nb.py"
    notebook.write_text("def f():\n    from ltm.ops.delta_rule.naive import naive_delta_rule\n")
    closure = {str(p.relative_to(ROOT)) for p in import_closure(notebook) if p != notebook}
    assert {"ltm/__init__.py", "ltm/ops/__init__.py", "ltm/ops/delta_rule/__init__.py",
            "ltm/ops/delta_rule/naive.py"} <= closure
    assert not covered(ROOT / "ltm" / "report.py", ["ltm/stages/train.py", "ltm/ops"])
    assert covered(ROOT / "ltm" / "ops" / "rwkv7" / "naive.py", ["ltm/ops"])
