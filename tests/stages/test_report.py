"""ltm.stages.report: the whole page built from the stages' outputs, compared with the last
commit, with a section for everything the workbook measures."""
import json
import subprocess
from pathlib import Path

import pandas as pd

from ltm.stages.report import report_stage


def _write_inputs(root):
    metrics, results, plots = root / "metrics", root / "results", root / "plots"
    for folder in (metrics, results, plots):
        folder.mkdir()
    (results / "tokenize.json").write_text(json.dumps({"documents": 3, "tokens": 1234}))
    (results / "train.json").write_text(json.dumps({"val_loss": 3.21, "tokens_per_s": 999.0}))
    (metrics / "train.json").write_text(json.dumps({"lm": {"val_nll": 3.21, "tokens_per_s": 999.0}}))
    # as the train stage writes them: each split in a file of its own
    pd.DataFrame({"step": [0, 10], "seconds": [0.1, 1.0],
                  "loss": [7.0, 5.0]}).to_csv(plots / "train_loss.csv", index=False)
    pd.DataFrame({"step": [10], "seconds": [1.1], "loss": [5.5]}).to_csv(plots / "val_loss.csv",
                                                                        index=False)
    pd.DataFrame({"switch": ["baseline", "model.kernel=naive"], "tokens_per_s": [100.0, 10.0],
                  "speedup": [1.0, 0.1], "val_loss": [5.0, 5.01]}).to_csv(plots / "ablate.csv", index=False)
    return metrics, plots


def _git(root, *args):
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


SECTIONS = ["Do latent thoughts carry information? The verdict", "Summary: what changed", "Run settings", "Data", "Training", "Latent thoughts",
            "A learned prior over latent thoughts",
            "Ablation verdicts", "Benchmarks", "Recall against distance", "Generated text",
            "Kernel benchmarks on GPUs (recorded history)",
            "Kernels against fla as installed (FlashQLA, TileLang)",
            "Training on GPUs (recorded history)",
            "The latent study on GPUs (recorded history)",
            "Titans memory on GPUs (recorded history)",
            "kernel: auto on GPUs (recorded history)",
            "Ablation verdicts on GPUs (recorded history)",
            "Time to a target loss on GPUs (recorded history)"]


def test_report_compares_with_the_last_commit_and_shows_every_section(tmp_path, monkeypatch):
    """Commit a run, change train.lr and the metrics as `dvc exp run -S train.lr=...` would, and
    build the report: the change of parameter, the val loss beside the last commit's with its
    noise verdict, and a figure with data in every section that has data."""
    monkeypatch.chdir(tmp_path)
    metrics, plots = _write_inputs(tmp_path)
    params = tmp_path / "params.yaml"
    params.write_text("model: {d_model: 32}\ntrain: {lr: 0.003}\ndata: {cache_dir: c}\nreport: {title: My run}\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    params.write_text(params.read_text().replace("lr: 0.003", "lr: 0.002"))
    (metrics / "train.json").write_text(json.dumps({"lm": {
        "val_nll": 3.01, "val_nll_noise": 0.02, "tokens_per_s": 1001.0, "tokens_per_s_noise": 30.0}}))
    out = tmp_path / "report.html"
    sections = report_stage(params, Path("metrics"), Path("results"), Path("plots"),
                            tmp_path / "bench", tmp_path / "gpu", out)
    assert [s.title for s in sections] == SECTIONS
    assert "no study.json" in sections[0].note
    summary = sections[1].tables[0].set_index("metric")
    val = summary.loc["validation NLL (nats/token)"]
    assert val["then"] == 3.21 and val["this run"] == 3.01
    # the last commit recorded no noise: the report says so rather than guess
    assert val["verdict"] == "noise not measured"
    settings = sections[2]
    changed = settings.tables[1]
    assert changed.to_dict("records") == [{"parameter": "train.lr", "HEAD": 0.003, "this run": 0.002}]
    assert "uncommitted changes" in settings.tables[0].setting.tolist()
    dirty = settings.tables[0].set_index("setting").loc["uncommitted changes", "value"]
    assert dirty.startswith("yes: ") and "params.yaml" in dirty
    for section in sections:
        for figure in section.figures:
            assert any(ax.has_data() for ax in figure.axes), section.title
    page = out.read_text()
    assert "<title>My run</title>" in page and "<script" not in page and "http" not in page
    assert page.count("data:image/png;base64,") == 2  # the loss curves and the ablation
    # the first screen: the headline box, then the contents; no index column in any table
    assert page.index("class=headline") < page.index("<nav>") < page.index("<h2")
    assert "Latent thoughts: no study in this run" in page and "What changed: against last commit" in page
    assert '<th></th>' not in page and "train.lr 0.003 -&gt; 0.002" in page
    assert "the benchmark stage has not written its metrics" in page
