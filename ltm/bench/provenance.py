"""Where a GPU measurement was made, for its record: the commit measured and the versions of the
packages that did the work. A record without them cannot be compared with the next one.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

# the repository this module belongs to: its configs/ and its git history
ROOT = Path(__file__).resolve().parents[2]


def commit(short: bool = False) -> str | None:
    """The commit measured: LTM_COMMIT when set (a copy of the tree without its own .git, whose
    parent repository's HEAD may be another commit), else this checkout's HEAD (None outside
    git)."""
    if os.environ.get("LTM_COMMIT"):
        return os.environ["LTM_COMMIT"]
    args = ["git", "-C", str(ROOT), "rev-parse"] + (["--short"] if short else []) + ["HEAD"]
    done = subprocess.run(args, capture_output=True, text=True)
    return done.stdout.strip() or None


def version_of(package: str) -> str | None:
    """A package's __version__, None where it is not installed (triton, torchao on some
    machines)."""
    try:
        return __import__(package).__version__
    except ImportError:
        return None
