import subprocess
import sys

import pytest

from ltm.report.plots import plot_specs, render_page

DVC_YAML = """stages: {}
plots:
  - loss:
      x: step
      y:
        train_loss.csv: loss
        val_loss.csv: loss
"""


@pytest.fixture
def repo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dvc.yaml").write_text(DVC_YAML)
    (tmp_path / "train_loss.csv").write_text("step,seconds,loss\n1,0.1,5\n2,0.2,4\n")
    (tmp_path / "val_loss.csv").write_text("step,seconds,loss\n2,0.2,4.5\n")
    for args in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"],
                 ["git", "add", "."],
                 ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(args, check=True, capture_output=True)
    (tmp_path / "train_loss.csv").write_text("step,seconds,loss\n1,0.1,5\n2,0.2,3\n")
    return tmp_path


def test_train_and_validation_are_separate_series_of_both_revisions(repo):
    specs, errors = plot_specs([])
    assert errors == [] and list(specs) == ["loss"]
    rows = specs["loss"][0]["data"]["values"]
    assert {(r["rev"], r["filename"]) for r in rows} == {
        ("workspace", "train_loss.csv"), ("workspace", "val_loss.csv"),
        ("HEAD", "train_loss.csv"), ("HEAD", "val_loss.csv")}


def test_the_page_draws_every_chart_offline(repo):
    page = render_page(*plot_specs([]), "t")
    assert page.count("<svg") == 1 and "<script" not in page
    assert "cdn" not in page and "https://" not in page
