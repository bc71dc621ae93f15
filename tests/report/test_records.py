import json

import pandas as pd
import pytest

from ltm.report.records import gpu_ablate_records, read_records


def test_records_come_by_file_name_with_their_content(tmp_path):
    (tmp_path / "b.json").write_text(json.dumps({"device": "GPU B", "runs": [1]}))
    (tmp_path / "a.json").write_text(json.dumps({"device": "GPU A", "runs": []}))
    (tmp_path / "notes.txt").write_text("not JSON, not read")
    records = read_records(tmp_path, "runs", "training")
    assert [(path.name, record["device"]) for path, record in records] == [("a.json", "GPU A"),
                                                                          ("b.json", "GPU B")]
    assert read_records(tmp_path / "missing", "runs", "training") == []


@pytest.mark.parametrize("text", ['{"device": "GPU", "rows": []}', '{"runs": []}', "[1, 2]",
                                  "{not json"], ids=["other-key", "no-device", "a-list", "broken"])
def test_a_file_that_is_no_record_is_named(tmp_path, text):
    (tmp_path / "x.json").write_text(text)
    with pytest.raises(ValueError, match=r"x\.json: not a training record \("):
        read_records(tmp_path, "runs", "training")


def _grid_record(ops_ms: dict, commit: str) -> dict:
    """A kernel_grid.py record: per (op, shape) ours and fla ms, forward only, floor 0.1 ms."""
    rows = []
    for (op, shape), (ours, fla) in ops_ms.items():
        for impl, ms in (("triton", ours), ("fla", fla)):
            rows.append({"op": op, "impl": impl, "B": shape[0], "T": shape[1], "H": shape[2],
                         "D": shape[3], "pass": "fwd", "ms": ms, "floor_ms": 0.1,
                         "x_floor": None if ms is None else ms / 0.1})
    return {"device": "GPU", "commit": commit, "grid": [], "rows": rows}


def test_latest_grid_takes_each_op_from_the_last_record_that_measured_it(tmp_path):
    from ltm.bench.kernel_grid import grid_summary
    from ltm.report.records import latest_grid
    a, b = (1, 512, 2, 64), (4, 256, 8, 128)
    (tmp_path / "kernel-grid-1.json").write_text(json.dumps(_grid_record(
        {("delta_rule", a): (1.0, 2.0), ("rwkv7", a): (1.0, 3.0)}, "aaaaaaaaa")))
    # the later file re-measured delta_rule only: rwkv7 stays from the first
    (tmp_path / "kernel-grid-2.json").write_text(json.dumps(_grid_record(
        {("delta_rule", a): (2.0, 1.0), ("delta_rule", b): (1.0, 4.0)}, "bbbbbbbbb")))
    # a kernel benchmark record without a grid is history only
    (tmp_path / "kernels.json").write_text(json.dumps({"device": "GPU", "rows": []}))
    grid = pd.DataFrame(latest_grid(tmp_path)).set_index(["op", "B"])
    assert grid.loc[("delta_rule", 1), "x_fla"] == 0.5 and grid.loc[("delta_rule", 1), "commit"] == "bbbbbbb"
    assert grid.loc[("rwkv7", 1), "x_fla"] == 3.0 and grid.loc[("rwkv7", 1), "record"] == "kernel-grid-1.json"
    summary = pd.DataFrame(grid_summary(latest_grid(tmp_path))).set_index("op")
    assert summary.loc["delta_rule", "geomean_x_fla"] == pytest.approx(2 ** 0.5)  # sqrt(0.5 * 4)
    assert summary.loc["delta_rule", "worst_x_fla"] == 0.5
    assert summary.loc["delta_rule", "worst_shape"] == "1,512,2,64"
    assert summary.loc["delta_rule", "worst_ours_x_floor"] == pytest.approx(20.0)


def test_latest_grid_orders_records_by_date_before_name(tmp_path):
    from ltm.report.records import latest_grid
    a = (1, 512, 2, 64)
    # an H200 record of one day sorts after the next day's H100 record by name, not by date
    later, earlier = _grid_record({("delta_rule", a): (1.0, 2.0)}, "later00"), _grid_record(
        {("delta_rule", a): (1.0, 3.0)}, "earlier")
    later["date"], earlier["date"] = "2026-11-26", "2026-11-25"
    (tmp_path / "kernel-grid-h100-2026-11-26.json").write_text(json.dumps(later))
    (tmp_path / "kernel-grid-h200-2026-11-25.json").write_text(json.dumps(earlier))
    (row,) = latest_grid(tmp_path)
    assert row["commit"] == "later00" and row["x_fla"] == 2.0


def test_a_grid_op_without_fla_times_has_no_ratio(tmp_path):
    from ltm.bench.kernel_grid import grid_summary
    from ltm.report.records import latest_grid
    (tmp_path / "g.json").write_text(json.dumps(_grid_record(
        {("gated_delta_rule", (1, 512, 2, 64)): (1.0, None)}, "c")))
    (summary,) = grid_summary(latest_grid(tmp_path))
    assert summary["with_fla"] == 0 and summary["geomean_x_fla"] is None



def test_latest_grid_gives_the_cuda_graph_times_beside_do_bench(tmp_path):
    from ltm.bench.kernel_grid import grid_summary
    from ltm.report.records import latest_grid
    a, b = (1, 512, 2, 64), (4, 256, 8, 128)
    record = _grid_record({("delta_rule", a): (2.0, 3.0), ("delta_rule", b): (1.0, 1.5)}, "g")
    # the forward at shape a timed in a CUDA graph as well; shape b and the backward were not
    record["grid"] = [{"section": "grid", "op": "delta_rule", "shape": list(a), "ours_fwd_graph": 0.5,
                       "fla_fwd_graph": 2.0, "ours_fb_graph": None}]
    (tmp_path / "kernel-grid.json").write_text(json.dumps(record))
    grid = pd.DataFrame(latest_grid(tmp_path)).set_index("B")
    assert grid.loc[1, "x_fla"] == 1.5 and grid.loc[1, "x_fla_graph"] == 4.0
    assert grid.loc[1, "ours_graph_ms"] == 0.5 and grid.loc[1, "ours_x_floor_graph"] == pytest.approx(5.0)
    assert pd.isna(grid.loc[4, "x_fla_graph"]) and grid.loc[4, "x_fla"] == 1.5
    (summary,) = grid_summary(latest_grid(tmp_path))
    assert summary["geomean_x_fla"] == pytest.approx(1.5) and summary["geomean_x_fla_graph"] == 4.0
    assert summary["worst_shape_graph"] == "1,512,2,64"

def test_gpu_ablate_records_pair_each_protocol_with_its_table(tmp_path):
    for name, device in (("b-run", "GPU b"), ("a-run", "GPU a")):
        (tmp_path / f"{name}.json").write_text(json.dumps({"protocol": {"device": device}}))
        (tmp_path / f"{name}.csv").write_text("switch,verdict\nbaseline,BASELINE\n")
    records = gpu_ablate_records(tmp_path)
    assert [(name, protocol["device"]) for name, protocol, _ in records] == [("a-run", "GPU a"),
                                                                            ("b-run", "GPU b")]
    assert records[0][2].switch.tolist() == ["baseline"]
    (tmp_path / "c.json").write_text(json.dumps({"rows": []}))
    (tmp_path / "c.csv").write_text("switch\n")
    with pytest.raises(ValueError, match=r"c\.json: not a GPU ablate record"):
        gpu_ablate_records(tmp_path)
