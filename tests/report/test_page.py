import json

import pandas as pd
import pytest

from ltm.report.page import (ablate_section, kernel_history_section, latent_section, recorded_kernel_rows,
                             samples_section, train_section)


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


def _comparison_train_json() -> dict:
    row = {"role": "configured", "n_latent": 0, "latent_steps": 0, "steps": 10, "tokens": 1000,
           "tokens_per_s": 100.0, "val_prefix_ppl": 250.0}
    return {"val_loss": 5.5, "comparison": [
        dict(row, model="plain", kind="plain", training_flops=1e9, val_loss=5.5,
             val_prefix_nll=5.52),
        dict(row, model="latent", kind="latent", role="counterpart: equal tokens", n_latent=4,
             latent_steps=1, training_flops=2e9, val_loss=20.0, val_prefix_nll=5.8),
        dict(row, model="plain-equal-flops", kind="plain", role="counterpart: equal FLOPs",
             steps=20, tokens=2000, training_flops=2e9, val_loss=5.3, val_prefix_nll=5.31)],
        "latent_model": {"model": "latent", "note": "1 inner steps per batch: reduced",
                         "val_nelbo_by_steps": {"0": 21.0, "1": 20.0, "4": 15.0},
                         "val_prefix_nll_by_steps": {"0": 5.9, "1": 5.8, "4": 5.85}}}


def test_latent_section_shows_the_curves_by_inference_steps_and_the_comparison(tmp_path):
    (tmp_path / "train.json").write_text(json.dumps(_comparison_train_json()))
    rows = [("plain", "val", 5, 6.0), ("plain", "val", 10, 5.5), ("latent", "val", 10, 20.0),
            ("plain-equal-flops", "val", 10, 5.8), ("plain-equal-flops", "val", 20, 5.3),
            ("plain", "train", 10, 5.4)]
    pd.DataFrame(rows, columns=["model", "split", "step", "loss"]).to_csv(
        tmp_path / "compare_loss.csv", index=False)
    section = latent_section(tmp_path, tmp_path)
    by_steps, table = section.tables
    assert by_steps["inference steps"].tolist() == [0, 1, 4]
    assert by_steps["NELBO bound (nats/token)"].tolist() == [21.0, 20.0, 15.0]
    assert by_steps["suffix NLL given prefix (nats/token)"].tolist() == [5.9, 5.8, 5.85]
    assert table["model"].tolist() == ["plain", "latent", "plain-equal-flops"]
    assert table["training FLOPs"].tolist() == [1e9, 2e9, 2e9]
    assert "reduced" in section.note
    (figure,) = section.figures
    bound, prefix, by_tokens, by_flops = figure.axes
    # the latent model's curve and the two plain models' levels in each
    assert [line.get_label() for line in bound.lines] == [
        "latent", "plain: NLL", "plain-equal-flops: NLL"]
    assert list(bound.lines[0].get_ydata()) == [21.0, 20.0, 15.0]
    assert list(bound.lines[1].get_ydata()) == [5.5, 5.5]
    assert list(prefix.lines[0].get_ydata()) == [5.9, 5.8, 5.85]
    assert list(prefix.lines[2].get_ydata()) == [5.31, 5.31]
    # the validation curves against tokens and FLOPs: the equal-FLOPs plain model ends where the
    # latent model ends in FLOPs, not in tokens
    ends = {line.get_label().split()[0]: line.get_xdata()[-1] for line in by_flops.lines}
    assert ends == {"plain": 1e9, "latent": 2e9, "plain-equal-flops": 2e9}
    assert {line.get_label().split()[0]: line.get_xdata()[-1] for line in by_tokens.lines} == {
        "plain": 1000, "latent": 1000, "plain-equal-flops": 2000}



def test_latent_section_adds_the_comparisons_recorded_on_gpus(tmp_path):
    (tmp_path / "train.json").write_text(json.dumps(_comparison_train_json()))
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    record = _comparison_train_json()
    record.update(device="H100", commit="abc1234", runs=[],
                  inner_loop={"rows": [{"case": "inner step", "impl": "compiled", "ms": 36.0,
                                        "tokens_per_s": None, "x_plain": 1.0}]})
    (gpu / "latent-h100.json").write_text(json.dumps(record))
    # a training record without latents is left to the GPU training section
    (gpu / "train-h100.json").write_text(json.dumps({"device": "H100", "runs": []}))
    section = latent_section(tmp_path, None, gpu)
    cpu_steps, cpu_table, gpu_steps, gpu_table, inner = section.tables
    assert gpu_steps["NELBO bound"].tolist() == [21.0, 20.0, 15.0]
    assert set(gpu_steps["record"]) == {"latent-h100.json"} and set(gpu_table["device"]) == {"H100"}
    assert gpu_table["model"].tolist() == ["plain", "latent", "plain-equal-flops"]
    assert inner["x_plain"].tolist() == [1.0]
    assert "recorded on a GPU" in section.note

def test_latent_section_without_counterparts_reads_the_latent_models_own_curves(tmp_path):
    (tmp_path / "train.json").write_text(json.dumps(
        {"val_loss": 9.0, "val_nelbo_by_steps": {"0": 12.0, "16": 9.0}}))
    section = latent_section(tmp_path)
    assert section.tables[0]["NELBO bound (nats/token)"].tolist() == [12.0, 9.0]
    assert len(section.figures) == 1 and len(section.figures[0].axes) == 1  # no prefix curve
    (tmp_path / "train.json").write_text(json.dumps({"val_loss": 5.0}))
    assert latent_section(tmp_path).figures == []


def test_training_section_plots_validation_loss_against_the_training_clock(tmp_path):
    (tmp_path / "train.json").write_text(json.dumps(
        {"val_loss": 5.0, "mixer": "attention", "optimizer": "muon", "target_loss": 5.2}))
    pd.DataFrame({"step": [10, 20], "seconds": [1.0, 2.5], "loss": [5.5, 5.0],
                  "train_seconds": [0.8, 2.0], "tokens": [100, 200]}).to_csv(
        tmp_path / "val_loss.csv", index=False)
    _, clock = train_section(tmp_path, tmp_path).figures
    by_seconds, by_tokens = clock.axes
    (curve, target) = by_seconds.lines
    assert list(curve.get_xdata()) == [0.8, 2.0] and list(curve.get_ydata()) == [5.5, 5.0]
    assert list(target.get_ydata()) == [5.2, 5.2] and curve.get_label() == "attention, muon"
    assert list(by_tokens.lines[0].get_xdata()) == [100, 200]


def test_the_training_table_says_what_kernel_auto_ran(tmp_path):
    choice = {"op": "delta_rule", "pass": "training", "dtype": "bfloat16", "D": 128,
              "T": "<=2048", "bh_per_sm": "0.25-1", "impl": "fla", "why": "fastest in h100.json"}
    (tmp_path / "train.json").write_text(json.dumps(
        {"mixer": "deltanet", "kernel": "auto", "val_loss": 5.0, "kernel_choices": [choice]}))
    (table,) = train_section(tmp_path, tmp_path).tables
    assert table["metric"].tolist() == ["mixer", "kernel", "kernel_choices", "val_loss"]
    assert table["value"][2] == "delta_rule training bfloat16 D128 T<=2048 BH/SM 0.25-1: fla"
    (tmp_path / "train.json").write_text(json.dumps({"kernel": "triton", "val_loss": 5.0}))
    assert "kernel_choices" not in train_section(tmp_path, tmp_path).tables[0]["metric"].tolist()


def test_the_kernel_history_is_the_grid_summary_and_one_row_per_record():
    from pathlib import Path
    records = Path(__file__).resolve().parents[2] / "records" / "bench"
    section = kernel_history_section(records)
    summary, per_record = section.tables
    assert {"op", "pass", "geomean_x_fla", "worst_x_fla"} <= set(summary)
    assert len(per_record) == len(list(records.glob("*.json"))) and section.folded
    assert per_record["rows"].sum() > 100  # the raw rows are counted, not shown


def test_the_ablation_section_shows_where_a_step_goes(tmp_path):
    pd.DataFrame({"switch": ["baseline", "train.opt.fused_loss=true"], "speedup": [1.0, 1.2],
                  "verdict": ["BASELINE", "PASS"], "delta_val_loss": [0.0, 0.0],
                  "speedup_low": [0.9, 1.1], "speedup_high": [1.1, 1.3]}).to_csv(
        tmp_path / "ablate.csv", index=False)
    without = ablate_section(tmp_path)
    (tmp_path / "ablate.json").write_text(json.dumps(
        {"profile": {"baseline": {"MLP": 30.0, "loss": 40.0}, "final": {"MLP": 30.0, "loss": 20.0}}}))
    with_profile = ablate_section(tmp_path, tmp_path)
    assert len(with_profile.figures) == len(without.figures) + 1
    profile = with_profile.figures[-1]
    assert profile.axes[0].get_title() == "where a training step's time goes"
    assert {t.get_text() for t in profile.axes[0].get_yticklabels()} == {"baseline", "final"}


def test_generated_text_shows_its_line_breaks_as_slashes(tmp_path):
    (tmp_path / "samples.json").write_text(json.dumps(
        {"settings": {"temperature": 0.8}, "samples": [{"prompt": "ROMEO:", "text": "ROMEO:\nWhy it\n\nthe bat\n"}]}))
    section = samples_section(tmp_path / "samples.json")
    assert section.tables[0]["text"].tolist() == ["ROMEO: / Why it / the bat"]
