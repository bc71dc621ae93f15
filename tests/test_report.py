import json

import pandas as pd

from ltm.report import report_stage


def _write_inputs(root):
    metrics, plots = root / "metrics", root / "plots"
    metrics.mkdir()
    plots.mkdir()
    (metrics / "tokenize.json").write_text(json.dumps({"documents": 3, "tokens": 1234}))
    (metrics / "train.json").write_text(json.dumps({"val_loss": 3.21, "tokens_per_s": 999.0}))
    pd.DataFrame({"step": [0, 10, 10], "split": ["train", "train", "val"],
                  "loss": [7.0, 5.0, 5.5]}).to_csv(plots / "train_loss.csv", index=False)
    pd.DataFrame({"switch": ["baseline", "model.kernel=naive"], "tokens_per_s": [100.0, 10.0],
                  "speedup": [1.0, 0.1], "val_loss": [5.0, 5.01]}).to_csv(plots / "ablate.csv", index=False)
    return metrics, plots


def test_report_embeds_every_section(tmp_path):
    metrics, plots = _write_inputs(tmp_path)
    params = tmp_path / "params.yaml"
    params.write_text("report:\n  title: My run\n")
    out = tmp_path / "report.html"
    sections = report_stage(params, metrics, plots, out)
    page = out.read_text()
    assert [s.title for s in sections] == ["Data", "Training", "Speed switches", "Benchmarks"]
    assert "<title>My run</title>" in page
    # loss curve + ablation figure, embedded as PNG
    assert page.count("data:image/png;base64,") == 2
    assert "model.kernel=naive" in page and "3.21" in page
    assert "the benchmark stage has not written its metrics" in page
