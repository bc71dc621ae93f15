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
import sys
import tempfile
from pathlib import Path

import jupytext
import papermill

from ltm.params import ParamsError

KERNEL_NAME = "ltm"
# errors whose message is meant for the user as it is; anything else is a bug and shows its type
USER_ERRORS = {"ParamsError", "DataError", "TrainingDiverged"}


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


def run_notebook(source: str | Path, output: str | Path, parameters: dict | None = None,
                 cwd: str | Path = ".", log_output: bool = True) -> None:
    """Execute the percent-format notebook `source` and write the result to `output`."""
    notebook = jupytext.read(source)
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        unexecuted = Path(tmp) / Path(source).with_suffix(".ipynb").name
        jupytext.write(notebook, unexecuted)
        papermill.execute_notebook(
            str(unexecuted), str(output), parameters=parameters or {}, kernel_name=KERNEL_NAME,
            language="python",
            cwd=str(cwd), log_output=log_output, progress_bar=False)


def _one_line(err: papermill.PapermillExecutionError) -> str:
    message = str(err.evalue).strip().splitlines()[0] if str(err.evalue).strip() else ""
    if err.ename in USER_ERRORS:
        return message
    return f"{err.ename}: {message} (full traceback in the executed notebook)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="percent-format notebook, e.g. notebooks/train.py")
    parser.add_argument("output", help="where the executed .ipynb goes")
    parser.add_argument("-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="a notebook parameter (string value)")
    args = parser.parse_args(argv)
    if not Path(args.source).is_file():
        print(f"ltm: {args.source}: no such notebook", file=sys.stderr)
        return 2
    try:
        run_notebook(args.source, args.output, dict(args.p))
    except papermill.PapermillExecutionError as err:
        print(f"ltm: {args.source} failed: {_one_line(err)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
