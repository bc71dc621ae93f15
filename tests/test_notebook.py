import json

from ltm.notebook import main

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


def test_user_error_ends_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.py").write_text(FAILING)
    assert main(["bad.py", "bad.ipynb"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "ltm: bad.py failed: train.stesp: unknown parameter (did you mean 'steps'?)"
    assert main(["missing.py", "x.ipynb"]) == 2
