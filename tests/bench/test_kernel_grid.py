"""The kernel grid's tables: ours paired with fla per op, shape and pass, the summary's geometric
mean and worst shape, the grid's shapes over the issue's ranges."""
import pytest

from ltm.bench.kernel_grid import format_grid, geomean, grid_summary, grid_table
from ltm.bench.kernels import GRID_SHAPES, RWKV7_GRID_SHAPES


def test_grid_covers_the_issue_ranges_and_its_table_pairs_ours_with_fla():
    for B, T, H, D in GRID_SHAPES + RWKV7_GRID_SHAPES:
        assert 8192 <= B * T <= 65536 and 512 <= T <= 32768 and 4 <= H <= 32 and D in (64, 128)
    assert {D for *_, D in GRID_SHAPES} == {64, 128} and any(B == 1 and T == 32768 for B, T, _, _ in GRID_SHAPES)
    base = {"op": "delta_rule", "B": 1, "T": 512, "H": 4, "D": 64, "pass": "fwd", "floor_ms": 0.5}
    rows = [dict(base, impl="triton", ms=2.0, x_floor=4.0), dict(base, impl="fla", ms=3.0, x_floor=6.0),
            dict(base, impl="sdpa", ms=1.0, x_floor=2.0),
            dict(base, impl="triton", ms=4.0, x_floor=8.0, **{"pass": "fwd+bwd"}),
            dict(base, impl="fla", ms=None, x_floor=None, error="refused", **{"pass": "fwd+bwd"})]
    table = grid_table(rows)
    assert len(table) == 2
    fwd, fb = table
    assert fwd["x_fla"] == pytest.approx(1.5) and fwd["ours_x_floor"] == 4.0 and fwd["fla_x_floor"] == 6.0
    assert fb["x_fla"] is None and fb["fla_error"] == "refused"
    text = format_grid(table)
    assert "geometric mean x_fla 1.50, worst 1.50 at 1,512,4,64" in text


def test_summary_takes_the_geometric_mean_and_the_worst_shape():
    def row(B, ours, fla):
        return {"op": "delta_rule", "B": B, "T": 512, "H": 4, "D": 64, "pass": "fwd", "floor_ms": 0.1,
                "ours_ms": ours, "fla_ms": fla, "ours_x_floor": ours / 0.1, "x_fla": fla / ours}
    (summary,) = grid_summary([row(1, 1.0, 4.0), row(2, 2.0, 2.0), row(4, 1.0, 2.0)])
    assert summary["shapes"] == 3 and summary["with_fla"] == 3
    assert summary["geomean_x_fla"] == pytest.approx(2.0) and geomean([4.0, 1.0, 2.0]) == pytest.approx(2.0)
    assert summary["worst_x_fla"] == 1.0 and summary["worst_shape"] == "2,512,4,64"
    assert summary["worst_ours_x_floor"] == pytest.approx(20.0)
