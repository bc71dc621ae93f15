import json

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


def test_report_embeds_every_section(tmp_path):
    metrics, plots = _write_inputs(tmp_path)
    params = tmp_path / "params.yaml"
    params.write_text("report:\n  title: My run\n")
    out = tmp_path / "report.html"
    sections = report_stage(params, metrics, plots, tmp_path / "bench", tmp_path / "gpu", out)
    page = out.read_text()
    assert [s.title for s in sections] == ["Data", "Training", "Speed switches", "Benchmarks",
                                           "Kernel benchmarks on GPUs (recorded history)",
                                           "Training on GPUs (recorded)"]
    assert "<title>My run</title>" in page
    # loss curve + ablation figure, embedded as PNG
    assert page.count("data:image/png;base64,") == 2
    assert "model.kernel=naive" in page and "3.21" in page
    assert "the benchmark stage has not written its metrics" in page
    assert "No GPU training records" in page and "No kernel benchmark records" in page


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
