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


def referenced_names(paths: set[Path]) -> set[str]:
    """Every name the files use or import (names, attributes, imported names)."""
    names = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[-1])
                names.add(node.name.split(".")[-1])
    return names


def _live_nodes(tree: ast.Module, used: set[str]):
    """The module's nodes, without the bodies of its top-level functions that no file of the
    closure names: a function nothing calls reads no section for this stage."""
    dead = {id(n) for n in tree.body if isinstance(n, ast.FunctionDef) and n.name not in used}
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        todo.extend(child for child in ast.iter_child_nodes(node) if id(child) not in dead)


def read_sections(paths: set[Path]) -> set[str]:
    """Sections of params.yaml that the code reads: `load_section(cls, "x", ...)`,
    `params.get("x")` and `params["x"]` (any name holding "params"); a `params.get(name)` with a
    computed name reads every section named in its function or in the module's constants
    (ablate's SWITCHABLE, the report's settings loop). Reads inside a top-level function count
    only where some file of `paths` names that function (load_configs reads model and train, but
    the study, which imports its module for TrainConfig, never calls it)."""
    found, used = set(), referenced_names(paths)
    for path in paths:
        tree = ast.parse(path.read_text())
        constants = [node.value for node in tree.body if isinstance(node, ast.Assign)]
        live = list(_live_nodes(tree, used))
        scopes = [n for n in live if isinstance(n, ast.FunctionDef)]
        for node in live:
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name == "load_section":
                    found |= _section_literals(node.args[1:2])
                elif name == "get" and "params" in ast.unparse(func.value) and node.args:
                    computed = not isinstance(node.args[0], ast.Constant)
                    scope = [f for f in scopes if any(n is node for n in ast.walk(f))]
                    found |= _section_literals((constants + scope) if computed else node.args[:1])
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


def test_a_section_read_by_a_function_nothing_calls_does_not_count(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def load_both(params):\n    return params.get('model'), params['train']\n\n"
                      "def data(params):\n    return load_section(object, 'data', params)\n\n"
                      "X = data({})\n")
    assert read_sections({module}) == {"data"}
    caller = tmp_path / "c.py"
    caller.write_text("from m import load_both\n")
    assert read_sections({module, caller}) == {"data", "model", "train"}


@pytest.mark.parametrize("name", sorted(STAGES))
def test_no_code_dependency_is_more_than_the_stage_runs(name):
    """The other way round: a code dep (a file or folder of ltm/, kernels/, notebooks/) holds a
    file the stage imports; otherwise an edit to it would rerun the stage for nothing (the train
    stage once listed the study's folder, so a study change retrained the model)."""
    stage = STAGES[name]
    closure = import_closure(stage_notebook(stage)) | import_closure(ROOT / "ltm" / "notebook.py")
    used = {p.relative_to(ROOT) for p in closure}
    code = [Path(d) for d in stage["deps"] if d.split("/")[0] in ("ltm", "kernels", "notebooks")]
    extra = sorted(str(d) for d in code if not any(u == d or d in u.parents for u in used))
    assert not extra, f"stage {name}: deps it never imports: {extra}"
