import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from ltm.report import gpu_section, recorded_kernel_rows, report_stage


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


def _git(root, *args):
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


SECTIONS = ["Summary: what changed", "Run settings", "Data", "Training", "Latent thoughts",
            "Ablation verdicts", "Benchmarks", "Generated text",
            "Kernel benchmarks on GPUs (recorded history)", "Training on GPUs (recorded history)"]


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
    (metrics / "train.json").write_text(json.dumps({"val_loss": 3.01, "val_loss_noise": 0.02,
                                                    "tokens_per_s": 1001.0, "tokens_per_s_noise": 30.0}))
    out = tmp_path / "report.html"
    sections = report_stage(params, Path("metrics"), Path("plots"), tmp_path / "bench",
                            tmp_path / "gpu", out)
    assert [s.title for s in sections] == SECTIONS
    summary = sections[0].tables[0].set_index("metric")
    val = summary.loc["validation loss (nats/token; a bound for latent models)"]
    assert val["then"] == 3.21 and val["this run"] == 3.01
    # the last commit recorded no noise: the report says so rather than guess
    assert val["verdict"] == "noise not measured"
    settings = sections[1]
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
    assert "the benchmark stage has not written its metrics" in page


def _gpu_record(runs, ddp=None) -> dict:
    return {"device": "Some GPU", "runs": runs, **({"ddp": ddp} if ddp else {})}


def test_gpu_section_tables_every_recorded_run_and_the_scaling(tmp_path):
    run = {"run": "attention-T1024", "commit": "abc1234", "seq_len": 1024, "batch_size": 16,
           "tokens_per_s": 1000.0, "mfu": 0.4, "peak_memory_mib": 9000.0}
    ddp = {"device": "2 x Some GPU", "run": "attention", "commit": "abc1234",
           "one_gpu": {"tokens_per_s": 1000.0}, "two_gpus": {"tokens_per_s": 1900.0}, "speedup": 1.9}
    (tmp_path / "a.json").write_text(json.dumps(_gpu_record([run], ddp)))
    (tmp_path / "b.json").write_text(json.dumps(_gpu_record([dict(run, run="deltanet-T8192",
                                                                   seq_len=8192)])))
    section = gpu_section(tmp_path)
    runs, scaling = section.tables
    assert list(runs.run) == ["attention-T1024", "deltanet-T8192"]
    assert list(runs.record) == ["a.json", "b.json"] and set(runs.device) == {"Some GPU"}
    assert scaling.speedup.tolist() == [1.9] and len(section.figures) == 1


def test_a_file_in_the_gpu_folder_that_is_no_record_is_named(tmp_path):
    (tmp_path / "notes.json").write_text(json.dumps({"device": "Some GPU", "rows": []}))
    with pytest.raises(ValueError, match=r"notes\.json: not a GPU training record"):
        gpu_section(tmp_path)


KERNEL_RECORD = {"device": "Some GPU", "commit": "abc1234", "rows": [
    {"op": "delta_rule", "impl": "triton", "B": 2, "T": 63, "H": 3, "D": 32, "pass": "fwd+bwd",
     "ms": 2.0, "x_fla": 1.25},
    {"op": "delta_rule", "impl": "fla", "B": 2, "T": 63, "H": 3, "D": 32, "pass": "fwd+bwd",
     "ms": 2.5, "x_fla": 1.0}]}


def test_recorded_kernel_rows_carry_device_commit_case_and_source(tmp_path):
    (tmp_path / "kernels-some.json").write_text(json.dumps(KERNEL_RECORD))
    rows = recorded_kernel_rows(tmp_path)
    assert rows.impl.tolist() == ["triton", "fla"] and rows.ms.tolist() == [2.0, 2.5]
    assert set(rows.device) == {"Some GPU"} and set(rows.commit) == {"abc1234"}
    assert set(rows.case) == {"2,63,3,32"} and set(rows.record) == {"kernels-some.json"}


def test_recorded_kernel_rows_of_an_empty_or_missing_folder_are_none(tmp_path):
    assert recorded_kernel_rows(tmp_path).empty and recorded_kernel_rows(tmp_path / "absent").empty


def test_a_file_in_the_bench_folder_that_is_no_record_is_named(tmp_path):
    (tmp_path / "notes.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="notes.json: not a kernel benchmark record"):
        recorded_kernel_rows(tmp_path)
