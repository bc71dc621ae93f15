"""Lets a gpu/ script import `ltm` from this checkout, installed or not: the repository root goes
on sys.path and, without `pip install -e .`, `ltm.kernels` is mapped to the kernels/ folder (as
pyproject.toml maps it for an install). Importing this module does it:

    from source_checkout import ROOT  # noqa: F401  (before any `ltm` import)
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if importlib.util.find_spec("ltm.kernels") is None:
    _kernels = ROOT / "kernels"
    _spec = importlib.util.spec_from_file_location("ltm.kernels", _kernels / "__init__.py",
                                                   submodule_search_locations=[str(_kernels)])
    sys.modules["ltm.kernels"] = _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)


def commit() -> str | None:
    """The commit measured: LTM_COMMIT when set (a copy of the tree without its own .git, whose
    parent repository's HEAD may be another commit), else this checkout's HEAD."""
    done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return os.environ.get("LTM_COMMIT") or done.stdout.strip() or None
