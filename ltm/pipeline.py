"""The paths of the pipeline, read from dvc.yaml, their one owner.

Each stage's `cmd` in dvc.yaml passes its notebook every path it reads or writes as a papermill
parameter (`-p metrics_path ${metrics}/train.json`). Under `dvc repro` papermill sets them; a
notebook opened in JupyterLab leaves them None and fills them from the same cmd here, so no path
is written twice:

    paths = stage_paths("train", metrics_path=metrics_path, ...)   # None = dvc.yaml's value

`${name}` in a cmd is resolved as DVC does: from the `vars` of dvc.yaml, then params.yaml.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from ltm.params import ParamsError, read_params

PLACEHOLDER = re.compile(r"\$\{\s*([^}\s]+)\s*\}")


def _lookup(values: dict, dotted: str, where: str) -> Any:
    value: Any = values
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            raise ParamsError(f"{where}: ${{{dotted}}} is neither a var of dvc.yaml nor a parameter")
        value = value[key]
    return value


def _variables(root: Path, dvc: dict) -> dict:
    """params.yaml, overlaid by the mappings listed under dvc.yaml's `vars`."""
    values = dict(read_params(root / "params.yaml"))
    for entry in dvc.get("vars") or []:
        for name, value in (entry.items() if isinstance(entry, dict) else ()):
            # DVC refuses the same: a var may not shadow a section of params.yaml
            if name in values:
                raise ParamsError(f"dvc.yaml: var {name!r} redefines a name of params.yaml")
            values[name] = value
    return values


def stage_command(stage: str, root: str | Path = ".") -> list[str]:
    """The stage's cmd from dvc.yaml with every ${...} resolved, split into words."""
    root = Path(root)
    dvc_file = root / "dvc.yaml"
    if not dvc_file.is_file():
        raise ParamsError(f"{dvc_file}: no such file (run from the folder holding dvc.yaml)")
    dvc = yaml.safe_load(dvc_file.read_text()) or {}
    stages = dvc.get("stages") or {}
    if stage not in stages:
        raise ParamsError(f"dvc.yaml: no stage {stage!r} (stages: {', '.join(stages)})")
    values = _variables(root, dvc)
    where = f"dvc.yaml, stage {stage}"
    cmd = PLACEHOLDER.sub(lambda m: str(_lookup(values, m.group(1), where)), stages[stage]["cmd"])
    return shlex.split(cmd)


def stage_parameters(stage: str, root: str | Path = ".") -> dict[str, str]:
    """The `-p name value` pairs of the stage's cmd: the notebook's parameters."""
    words = stage_command(stage, root)
    return {words[i + 1]: words[i + 2] for i, word in enumerate(words[:-2]) if word == "-p"}


def stage_paths(stage: str, root: str | Path = ".", **given: str | None) -> dict[str, str]:
    """`given` with every None replaced by the stage's value from dvc.yaml. A name that the
    stage's cmd does not pass is an error: notebook and dvc.yaml must agree on the names."""
    if all(value is not None for value in given.values()):
        # every path given (the stage under DVC, or a command line): dvc.yaml need not be here
        return dict(given)
    defaults = stage_parameters(stage, root)
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ParamsError(f"dvc.yaml, stage {stage}: its cmd passes no {', '.join(unknown)} "
                          f"(it passes {', '.join(defaults) or 'nothing'})")
    return {name: defaults[name] if value is None else value for name, value in given.items()}
