"""Run a stage notebook: read its jupytext percent-format source, execute it with papermill and
save the executed .ipynb. The `.py` source is what git and DVC track, so saving a notebook in
JupyterLab changes nothing that DVC sees unless a cell's code changed.

    python -m ltm.notebook notebooks/train.py reports/notebooks/train.ipynb [-p name value ...]

A failure inside the notebook ends with one line naming the error (for example a bad key in
params.yaml), the full traceback stays in the saved notebook.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from types import ModuleType

from ltm.params import ParamsError

KERNEL_NAME = "ltm"
# errors whose message is meant for the user as it is; anything else is a bug and shows its type
USER_ERRORS = {"ParamsError", "DataError", "TrainingDiverged"}
# tqdm.auto (a library the benchmark stage imports uses it) warns in a kernel without ipywidgets,
# naming the user's site-packages in the saved notebook; its text progress bars work as they are
warnings.filterwarnings("ignore", message="IProgress not found")


def enter_project_root(start: str | Path | None = None) -> Path:
    """Change to the folder holding dvc.yaml, `start` (default: the working directory) or the
    nearest one above it, and return it. Stage notebooks call this first: JupyterLab starts a
    notebook's kernel in notebooks/, while params.yaml and every path in it are relative to the
    root, where DVC and papermill run them."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "dvc.yaml").is_file():
            os.chdir(folder)
            return folder
    raise ParamsError(f"no dvc.yaml in {here} or above it: open the notebook inside an ltm checkout")


class MissingTools(RuntimeError):
    """The notebook runner's packages are not importable by this Python."""


def notebook_tools() -> tuple[ModuleType, ModuleType]:
    """jupytext and papermill, imported when a notebook is run, not when a stage notebook's kernel
    imports enter_project_root from here (2.5 s of every stage's start, twice)."""
    # jsonschema checks the "iri" string format with rfc3987-syntax where that is installed
    # (jupyter's event schemas pull it in), and that package builds its grammar at import: 1.6 s.
    # No notebook schema nbformat validates against uses the format, so the runner goes without it
    # (None in sys.modules: the import fails and jsonschema skips that checker, as when absent).
    sys.modules.setdefault("rfc3987_syntax", None)
    try:
        import jupytext
        import papermill
    except ModuleNotFoundError as err:
        # `dvc repro` run by a dvc outside the project's virtualenv: the stages' `python` is then
        # whichever comes first on PATH, usually one without the notebook tools
        raise MissingTools(f"{err.name} is not installed for {sys.executable}: run the stages "
                           "with the project's virtualenv active (`make` once, then `source "
                           ".venv/bin/activate`), or through `make workbook`") from None
    return jupytext, papermill


def run_notebook(source: str | Path, output: str | Path, parameters: dict | None = None,
                 cwd: str | Path = ".", echo: bool = True) -> None:
    """Execute the percent-format notebook `source` and write the result to `output`; with
    `echo`, what its cells print (stdout, stderr) also goes to this process's terminal as it
    comes, and what they display (tables, figures) stays in the notebook."""
    jupytext, papermill = notebook_tools()
    notebook = jupytext.read(source)
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        unexecuted = Path(tmp) / Path(source).with_suffix(".ipynb").name
        jupytext.write(notebook, unexecuted)
        papermill.execute_notebook(
            str(unexecuted), str(output), parameters=parameters or {}, kernel_name=KERNEL_NAME,
            language="python",
            cwd=str(cwd), log_output=False, progress_bar=False,
            stdout_file=sys.stdout if echo else None, stderr_file=sys.stderr if echo else None,
            # the kernel's own start-up warnings (the TCP transport's, at every stage) are
            # Jupyter's business, not the stage's output; errors still show
            extra_arguments=["--IPKernelApp.log_level=ERROR"])


def _one_line(err: Exception) -> str:
    """A papermill execution error as one line: the user's message, or the error's type too."""
    message = str(err.evalue).strip().splitlines()[0] if str(err.evalue).strip() else ""
    if err.ename in USER_ERRORS:
        return message
    return f"{err.ename}: {message} (full traceback in the executed notebook)"


# a copy of each successful stage's files (the -p paths that exist afterwards), because DVC
# deletes a stage's outputs before it runs it: a failed run would otherwise lose the last results
LAST_RUN = Path(".dvc") / "tmp" / "ltm-last-run"
# only results this small are kept (metrics, plot tables, the report); checkpoints are large and
# DVC keeps them anyway (persist: true), the token cache is in DVC's cache
KEEP_AT_MOST = 16 << 20


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() \
        else path.stat().st_size


def keep_last_run(paths: list[str]) -> None:
    """Copy every existing file or folder among `paths` (relative, inside the project) to
    LAST_RUN, replacing the copy of the previous successful run."""
    for name in paths:
        source = Path(name)
        if (source.is_absolute() or ".." in source.parts or not source.exists()
                or _size(source) > KEEP_AT_MOST):
            continue
        target = LAST_RUN / source
        if target.is_dir():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy2(source, target)


def restore_last_run() -> list[Path]:
    """Put back every file kept by keep_last_run where it was; returns the files restored."""
    restored = []
    for kept in sorted(p for p in LAST_RUN.rglob("*") if p.is_file()):
        place = kept.relative_to(LAST_RUN)
        place.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(kept, place)
        restored.append(place)
    return restored


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", help="percent-format notebook, e.g. notebooks/train.py")
    parser.add_argument("output", nargs="?", help="where the executed .ipynb goes")
    parser.add_argument("-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="a notebook parameter (string value)")
    parser.add_argument("--restore-last-run", action="store_true",
                        help="put back the metrics and plots of each stage's last successful run "
                             "(after a failed stage, whose outputs DVC removed)")
    args = parser.parse_args(argv)
    if args.restore_last_run:
        restored = restore_last_run()
        print(f"ltm: restored {len(restored)} files of the last successful runs from {LAST_RUN}")
        return 0
    if not args.source or not args.output:
        parser.error("a notebook and an output path are needed")
    if not Path(args.source).is_file():
        print(f"ltm: {args.source}: no such notebook", file=sys.stderr)
        return 2
    start = time.perf_counter()
    try:
        _, papermill = notebook_tools()
    except MissingTools as err:
        print(f"ltm: {err}", file=sys.stderr)
        return 2
    try:
        run_notebook(args.source, args.output, dict(args.p))
    except papermill.PapermillExecutionError as err:
        print(f"ltm: {args.source} failed: {_one_line(err)}", file=sys.stderr)
        return 1
    # where the minutes go: one line per stage, on the terminal that runs dvc repro
    print(f"ltm: {args.source} done in {time.perf_counter() - start:.0f} s", flush=True)
    # the executed notebook too: DVC removes it with the rest, and it is in dvc.lock
    keep_last_run([value for _, value in args.p] + [args.output])
    return 0


if __name__ == "__main__":
    sys.exit(main())
