"""The report's references section and its readers (`ltm.report.records.reference_rows`,
`reference_summary`): each measured pass with the backends it ran, the fastest path, and a shape
measured twice counted with its worse ratio."""
import json
import subprocess

import pytest
import torch

from ltm.ops.auto import shape_class
from ltm.report.headline import references_line
from ltm.report.records import history_rank, reference_rows, reference_summary
from ltm.report.references import auto_pick, kernel_references_section


def grid_row(shape, ours, triton, installed, backend="flash_qla"):
    """A `gpu/grid_references.sh` row of the gated delta rule, forward only."""
    return {"section": "grid", "op": "gated_delta_rule", "shape": shape,
            "references": ["fla_triton", "fla_installed"], "ours_fwd": ours,
            "fla_triton_fwd": triton, "fla_triton_fwd_backend": "triton",
            "fla_installed_fwd": installed, "fla_installed_fwd_backend": backend,
            "fla_fwd": min(triton, installed),
            "fla_fwd_ref": "fla_installed (flash_qla)" if installed < triton else "fla_triton (triton)"}


def write(folder, name, rows, commit="abcdef123", date="2026-11-27"):
    folder.mkdir(exist_ok=True)
    record = {"device": "GPU X", "commit": commit, "date": date, "grid": rows,
              "versions_backends": {"flash-qla": "0.1.3"}}
    (folder / name).write_text(json.dumps(record))


def test_each_pass_gives_every_path_its_backend_and_the_ratios(tmp_path):
    write(tmp_path, "a.json", [grid_row([1, 64, 2, 128], 1.0, 3.0, 0.5),
                               {"section": "grid", "op": "gated_delta_rule", "shape": [2, 64, 2, 128],
                                "skipped": "budget spent"}])
    rows = reference_rows(tmp_path)
    assert len(rows) == 1
    row = rows.iloc[0]
    assert row["shape"] == "1,64,2,128" and row["pass"] == "fwd" and row["commit"] == "abcdef1"
    assert row["fla_installed_backend"] == "flash_qla" and row["fla_triton_backend"] == "triton"
    assert row["x_best"] == pytest.approx(0.5) and row["x_triton"] == pytest.approx(3.0)
    assert row["fastest_fla"] == "fla_installed (flash_qla)"


def test_the_summary_counts_a_repeated_shape_with_its_worse_ratio(tmp_path):
    write(tmp_path, "a.json", [grid_row([1, 64, 2, 128], 1.0, 3.0, 0.5),
                               grid_row([4, 64, 2, 128], 1.0, 3.0, 2.0)])
    write(tmp_path, "b.json", [grid_row([1, 64, 2, 128], 1.0, 3.0, 0.8)])
    (summary,) = reference_summary(reference_rows(tmp_path)).to_dict("records")
    assert summary["shapes"] == 2 and summary["worst x_best"] == pytest.approx(0.5)
    assert summary["worst shape"] == "1,64,2,128"
    assert summary["geomean x_best"] == pytest.approx((0.5 * 2.0) ** 0.5)
    assert summary["worst x_triton"] == pytest.approx(3.0)


def test_the_summary_keeps_each_commit_apart_newest_first(tmp_path):
    # an old commit's worse ratio at a shape must not stand for the newer kernels' (nor the
    # headline's line, which reads the newest commit only)
    write(tmp_path, "a.json", [grid_row([1, 64, 2, 128], 1.0, 3.0, 0.5)])
    write(tmp_path, "b.json", [grid_row([1, 64, 2, 128], 1.0, 3.0, 1.5)], commit="fedcba987",
          date="2026-12-07")
    summary = reference_summary(reference_rows(tmp_path))
    assert list(summary["commit"]) == ["fedcba9", "abcdef1"]
    assert list(summary["worst x_best"]) == pytest.approx([1.5, 0.5])
    line = references_line(tmp_path)
    assert "worst 1.50x at 1,64,2,128" in line and "fedcba9" in line and "0.50x" not in line


def test_the_section_shows_the_summary_then_every_measurement(tmp_path):
    assert kernel_references_section(tmp_path / "missing").tables == []
    write(tmp_path, "a.json", [grid_row([1, 64, 2, 128], 1.0, 3.0, 0.5)])
    section = kernel_references_section(tmp_path)
    summary, measured = section.tables
    assert list(summary["op"]) == ["gated_delta_rule"] and section.folded
    assert "fla_installed_backend" in measured and "fla_gated_g0_ms" not in measured
    assert "flash-qla 0.1.3" in section.note and "GPU X" in section.note


def auto_table(path, device, shape, ms):
    """A one-entry auto table for `device`: ltm's delta_rule (the grid's gated rule), forward."""
    B, T, H, D = shape
    key = shape_class("delta_rule", B, T, H, D, torch.bfloat16, training=False, sm_count=4)
    path.write_text(json.dumps({"version": 1, "device": device, "sm_count": 4,
                                "fla_backends": ["flash_qla"],
                                "entries": [{**key, "shapes": [shape], "ms": ms}]}))


def test_auto_runs_what_the_devices_table_picks_timed_as_that_path(tmp_path, monkeypatch):
    """The table picks fla as installed at the measured class: auto's time is fla_installed's in
    the same record, auto_x_best its time over the fastest path; a class the table lacks, an
    unknown device: ours; the ungated rule (no layer calls it): no auto."""
    auto_table(tmp_path / "table.json", "GPU Y", [1, 64, 2, 128],
               {"triton": [1.0], "fla_installed": [0.5]})
    monkeypatch.setenv("LTM_AUTO_TABLE", str(tmp_path / "table.json"))
    assert auto_pick("gated_delta_rule", "1,64,2,128", "fwd", "GPU Y") == "fla_installed"
    assert auto_pick("gated_delta_rule", "1,64,2,128", "fwd+bwd", "GPU Y") == "ours"
    assert auto_pick("gated_delta_rule", "1,64,2,128", "fwd", "GPU unknown") == "ours"
    assert auto_pick("delta_rule", "1,64,2,128", "fwd", "GPU Y") is None
    records = tmp_path / "records"
    records.mkdir()
    (records / "a.json").write_text(json.dumps({
        "device": "GPU Y",
        "grid": [grid_row([1, 64, 2, 128], 1.0, 3.0, 0.5),
                 {**grid_row([1, 64, 2, 128], 1.0, 3.0, 0.5), "op": "delta_rule"},
                 grid_row([8, 64, 2, 128], 1.0, 3.0, 0.4)]}))
    measured = kernel_references_section(records).tables[1]
    gated = measured[measured["op"] == "gated_delta_rule"].set_index("shape")
    assert gated.loc["1,64,2,128", "auto"] == "fla_installed"
    assert gated.loc["1,64,2,128", "auto_ms"] == pytest.approx(0.5)
    assert gated.loc["1,64,2,128", "auto_x_best"] == pytest.approx(1.0)
    # no entry for B 8 (another B*H class): ours, 2.5x the fastest path
    assert gated.loc["8,64,2,128", "auto"] == "ours"
    assert gated.loc["8,64,2,128", "auto_x_best"] == pytest.approx(2.5)
    assert measured[measured["op"] == "delta_rule"]["auto"].isna().all()
    # worst x_best first within the op and pass
    assert list(gated.index) == ["8,64,2,128", "1,64,2,128"]


def test_records_of_one_date_go_newest_commit_first_by_history(tmp_path):
    # two records of one date: the date cannot order them, the repository's history does (the
    # older commit's record is read first, so file order alone would put it first)
    repo = tmp_path / "repo"
    repo.mkdir()
    run = lambda *args: subprocess.run(["git", "-C", str(repo), *args], check=True,
                                       capture_output=True, text=True).stdout.strip()
    run("init", "-q")
    hashes = []
    for message in ("older", "newer"):
        run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty",
            "-m", message)
        hashes.append(run("rev-parse", "HEAD"))
    folder = tmp_path / "records"
    write(folder, "a.json", [grid_row([1, 64, 2, 128], 1.0, 3.0, 0.5)], commit=hashes[0],
          date="2026-12-07")
    write(folder, "b.json", [grid_row([1, 64, 2, 128], 1.0, 3.0, 1.5)], commit=hashes[1],
          date="2026-12-07")
    summary = reference_summary(reference_rows(folder), repo=repo)
    assert list(summary["commit"]) == [hashes[1][:7], hashes[0][:7]]
    assert history_rank([hashes[0][:7], "0000000"], repo) == {hashes[0][:7]: 1, "0000000": 2}
    # without a history to read, the date's order is kept
    unordered = reference_summary(reference_rows(folder), repo=tmp_path / "no-repo")
    assert list(unordered["commit"]) == [hashes[0][:7], hashes[1][:7]]
