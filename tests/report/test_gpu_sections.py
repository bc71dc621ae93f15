"""The report's GPU-history sections: training runs, ablate verdicts, time to a target loss."""
import json

import pytest

from ltm.report.gpu import gpu_ablate_section, gpu_section, gpu_time_to_target_section


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


GPU_ABLATE_CSV = """switch,kind,verdict,speedup,speedup_low,speedup_high,step_ms,delta_val_loss,peak_memory_mib,note,tolerance
baseline,exact,BASELINE,1.0,0.9,1.1,70.0,0.0,16000,,0.0
model.hier_op=dual,exact,NO EFFECT,0.99,0.91,1.10,71.0,0.0,15100,,0.01
model.hier_fast_read=chunk,approximate,SLOWER,0.62,0.58,0.66,113.0,-0.012,20600,,0.05
"""


def test_gpu_ablate_section_shows_each_recorded_run_with_its_device_and_commit(tmp_path):
    assert "No GPU ablate records" in gpu_ablate_section(tmp_path / "ablate").note
    folder = tmp_path / "ablate"
    folder.mkdir()
    protocol = {"device": "Some GPU", "torch": "2.11", "commit": "abc1234def", "params": "p.yaml"}
    (folder / "run.json").write_text(json.dumps({"protocol": protocol}))
    (folder / "run.csv").write_text(GPU_ABLATE_CSV)
    section = gpu_ablate_section(folder)
    (table,) = section.tables
    assert table.verdict.tolist() == ["BASELINE", "NO EFFECT", "SLOWER"]
    assert "tolerance" not in table
    assert "run: Some GPU, torch 2.11, commit abc1234, p.yaml" in section.note
    assert len(section.figures) == 1 and any(ax.has_data() for ax in section.figures[0].axes)
    (folder / "cut.json").write_text(json.dumps({"protocol": protocol}))
    with pytest.raises(ValueError, match=r"cut\.json: not a GPU ablate record with its CSV"):
        gpu_ablate_section(folder)


def test_a_file_in_the_gpu_folder_that_is_no_record_is_named(tmp_path):
    (tmp_path / "notes.json").write_text(json.dumps({"device": "Some GPU", "rows": []}))
    with pytest.raises(ValueError, match=r"notes\.json: not a GPU training record"):
        gpu_section(tmp_path)


def _ttt_run(optimizer, losses, seconds, fixed):
    curve = [{"step": i, "split": "val", "loss": loss, "train_seconds": t, "tokens": 1000 * (i + 1)}
             for i, (loss, t) in enumerate(zip(losses, seconds))]
    return {"optimizer": optimizer, "batch": 8, "lr": 3e-3, "steps": 10, "curve": curve,
            "val_loss": losses[-1], "final_minus_reference": 0.0, "equal_quality": True,
            "tokens_per_s": 100.0, "time_to_target_s": seconds[-1], "tokens_to_target": 3000,
            "speedup": 1.0, "fixed_targets": fixed}


def test_time_to_target_section_tables_each_run_with_its_worst_fixed_target(tmp_path):
    assert "No time-to-target records" in gpu_time_to_target_section(tmp_path / "ttt").note
    folder = tmp_path / "ttt"
    folder.mkdir()
    runs = {"adamw": _ttt_run("adamw", [5.0, 4.5, 4.0], [1.0, 2.0, 3.0], {"4.5": 1.0, "4.0": 1.0}),
            "muon": _ttt_run("muon", [4.8, 4.2, 3.9], [0.5, 1.0, 1.5], {"4.5": 2.0, "4.0": 1.8, "3.9": None})}
    record = {"device": "Some GPU", "torch": "2.11", "commit": "abc1234def",
              "ttt": {"target_loss": 4.0, "reference": "adamw", "compile": True, "seed": 7, "runs": runs}}
    (folder / "run.json").write_text(json.dumps(record))
    section = gpu_time_to_target_section(folder)
    (table,) = section.tables
    assert table.name.tolist() == ["adamw", "muon"]
    assert table.worst_fixed_target_speedup.tolist() == [1.0, 1.8]
    assert "run.json: Some GPU, torch 2.11, commit abc1234, compiled, seed 7, target 4.0000" in section.note
    assert len(section.figures) == 1 and any(ax.has_data() for ax in section.figures[0].axes)
    (folder / "skipped.json").write_text(json.dumps({"device": "Some GPU", "ttt": {"skipped": "no cache"}}))
    with pytest.raises(ValueError, match=r"skipped\.json: a time-to-target record without scored runs \(no cache\)"):
        gpu_time_to_target_section(folder)
    (folder / "skipped.json").unlink()
    (folder / "notes.json").write_text(json.dumps({"device": "Some GPU"}))
    with pytest.raises(ValueError, match=r"notes\.json: not a time-to-target record"):
        gpu_time_to_target_section(folder)
