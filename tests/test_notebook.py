import copy
import json
import subprocess
import sys
from pathlib import Path

import jupytext
import nbformat
import pytest
from jupytext.config import load_jupytext_configuration_file

from ltm.notebook import enter_project_root, main
from ltm.params import ParamsError

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"

NOTEBOOK = '''# %% tags=["parameters"]
greeting = "hello"

# %%
print(greeting * 2)
'''

FAILING = '''# %%
from ltm.params import ParamsError
raise ParamsError("train.stesp: unknown parameter (did you mean 'steps'?)")
'''


def test_runs_percent_notebook_with_parameters(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nb.py").write_text(NOTEBOOK)
    assert main(["nb.py", "out/nb.ipynb", "-p", "greeting", "ab"]) == 0
    cells = json.loads((tmp_path / "out" / "nb.ipynb").read_text())["cells"]
    printed = ["".join(o.get("text", "")) for c in cells for o in c.get("outputs", [])]
    assert "abab\n" in printed


PRINTS_AND_SHOWS = """# %%
import sys
import pandas as pd
print("a line for the terminal")
print("a warning for the terminal", file=sys.stderr)
pd.DataFrame({"shown_only_in_the_notebook": [1, 2]})
"""


def test_printed_lines_reach_the_terminal_and_displayed_tables_do_not(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nb.py").write_text(PRINTS_AND_SHOWS)
    assert main(["nb.py", "nb.ipynb"]) == 0
    out, err = capfd.readouterr()  # file descriptors: the kernel process writes to them too
    assert "a line for the terminal" in out and "a warning for the terminal" in err
    assert "shown_only_in_the_notebook" not in out + err
    assert "without encryption" not in out + err  # the kernel's start-up warning
    assert "shown_only_in_the_notebook" in (tmp_path / "nb.ipynb").read_text()


def test_user_error_ends_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.py").write_text(FAILING)
    assert main(["bad.py", "bad.ipynb"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "ltm: bad.py failed: train.stesp: unknown parameter (did you mean 'steps'?)"
    assert main(["missing.py", "x.ipynb"]) == 2


def test_a_python_without_the_notebook_tools_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.py").write_text(NOTEBOOK)
    monkeypatch.setitem(sys.modules, "jupytext", None)  # as if not installed: its import fails
    assert main(["ok.py", "ok.ipynb"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"ltm: jupytext is not installed for {sys.executable}")
    assert "source .venv/bin/activate" in err[0] and not (tmp_path / "ok.ipynb").exists()


DIVERGED = '''# %%
from ltm.train.settings import TrainingDiverged
raise TrainingDiverged("train loss is nan at step 3: stopped; no checkpoint was written")
'''


def test_a_diverged_run_ends_in_its_own_line(tmp_path, monkeypatch, capsys):
    # the stage runner's view of the train stage: the message, not a type name and a pointer
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(DIVERGED)
    assert main(["train.py", "train.ipynb"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "ltm: train.py failed: train loss is nan at step 3: stopped; no checkpoint was written"


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.py")), ids=lambda p: p.stem)
def test_saving_from_jupyterlab_leaves_the_tracked_py_unchanged(path):
    # what a save in JupyterLab does: the paired .ipynb (now with kernel metadata) written back to
    # the percent .py under notebooks/jupytext.toml
    config = load_jupytext_configuration_file(str(NOTEBOOKS / "jupytext.toml"))
    text = path.read_text()
    notebook = nbformat.reads(nbformat.writes(jupytext.reads(text, fmt="py:percent")), as_version=4)
    notebook.metadata["kernelspec"] = {"name": "ltm", "display_name": "Python (ltm)",
                                       "language": "python"}
    unfiltered = copy.deepcopy(notebook)
    unfiltered.metadata.pop("jupytext", None)
    config.set_default_format_options(notebook.metadata.setdefault("jupytext", {}))
    assert jupytext.writes(notebook, fmt="py:percent", config=config) == text
    # without the configuration's filters the kernel metadata would land in the .py
    assert "kernelspec" in jupytext.writes(unfiltered, fmt="py:percent")


FIGURE = '''# %%
# %matplotlib inline
import pandas as pd
from ltm.report.page import loss_figure
loss_figure(pd.DataFrame({"step": [1, 2, 2], "split": ["train", "train", "val"], "loss": [2.0, 1.5, 1.7]}))
'''


def test_figures_show_as_images_in_executed_notebooks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nb.py").write_text(FIGURE)
    assert main(["nb.py", "nb.ipynb"]) == 0
    cells = nbformat.read(tmp_path / "nb.ipynb", as_version=4).cells
    outputs = [out for cell in cells for out in cell.get("outputs", [])]
    assert any("image/png" in out.get("data", {}) for out in outputs), outputs


def test_enter_project_root_climbs_from_notebooks_to_the_dvc_yaml(tmp_path, monkeypatch):
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    assert enter_project_root() == tmp_path.resolve()
    assert Path.cwd() == tmp_path.resolve()


def test_a_stage_kernel_importing_enter_project_root_loads_no_notebook_runner():
    # every stage notebook's kernel imports it first; jupytext and papermill are the runner's
    code = ("import sys; from ltm.notebook import enter_project_root; "
            "print(sorted(m for m in ('jupytext', 'papermill', 'nbformat', 'jsonschema') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_enter_project_root_outside_a_checkout_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ParamsError, match="no dvc.yaml"):
        enter_project_root()


def test_stage_notebooks_with_figures_use_the_inline_backend():
    # without it a kernel shows a figure as "<Figure size ...>" text
    for source in NOTEBOOKS.glob("*.py"):
        text = source.read_text()
        if "figure" in text:
            assert "# %matplotlib inline" in text, source.name


WRITER = '''# %% tags=["parameters"]
metrics_path = "m.json"
fail = "no"

# %%
from pathlib import Path
if fail == "yes":
    raise RuntimeError("broken")
Path(metrics_path).parent.mkdir(parents=True, exist_ok=True)
Path(metrics_path).write_text('{"val_loss": 1.5}')
'''


def test_a_failed_stage_leaves_the_last_runs_metrics_restorable(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nb.py").write_text(WRITER)
    assert main(["nb.py", "out.ipynb", "-p", "metrics_path", "reports/metrics/m.json"]) == 0
    executed = (tmp_path / "out.ipynb").read_bytes()
    # what DVC does before it runs the stage again (the executed notebook is an output too),
    # then the run fails
    (tmp_path / "reports" / "metrics" / "m.json").unlink()
    (tmp_path / "out.ipynb").unlink()
    assert main(["nb.py", "out.ipynb", "-p", "metrics_path", "reports/metrics/m.json",
                 "-p", "fail", "yes"]) == 1
    assert not (tmp_path / "reports" / "metrics" / "m.json").exists()
    assert (tmp_path / "out.ipynb").is_file()  # the failed run's, with its traceback
    assert main(["--restore-last-run"]) == 0
    assert (tmp_path / "reports" / "metrics" / "m.json").read_text() == '{"val_loss": 1.5}'
    # byte for byte the successful run's notebook, so its hash in dvc.lock matches again
    assert (tmp_path / "out.ipynb").read_bytes() == executed
    assert "restored 2 files" in capsys.readouterr().out
