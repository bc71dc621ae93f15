import math

import pytest

from ltm.ablation.measure import Measurement, make_row, verdict


def _m(low: float, high: float, loss: float = 3.0) -> Measurement:
    return Measurement(step_s=(low + high) / 2, low_s=low, high_s=high, val_loss=loss)


@pytest.mark.parametrize("cand, expected", [
    (_m(0.5, 0.6), "PASS"),  # faster beyond both spreads
    (_m(0.8, 1.05), "NO EFFECT"),  # faster, but inside the spread
    (_m(1.2, 1.3), "SLOWER"),
    (_m(0.5, 0.6, loss=3.2), "FAIL"),  # fast, but the quality moved
    (_m(0.5, 0.6, loss=math.nan), "FAIL"),
])
def test_verdicts(cand, expected):
    assert verdict(_m(0.9, 1.1), cand, tolerance=0.1) == expected


@pytest.mark.parametrize("loss, exact, expected", [
    (2.8, True, "FAIL"),   # an exact switch that moves the score either way is a bug
    (3.2, True, "FAIL"),
    (2.8, False, "PASS"),  # an approximate switch may improve quality (Muon: -0.12 on an H100)
    (3.2, False, "FAIL"),  # ... but not lose it
    (3.05, False, "PASS"),
])
def test_approximate_switches_fail_only_when_worse(loss, exact, expected):
    assert verdict(_m(0.9, 1.1), _m(0.5, 0.6, loss=loss), tolerance=0.1, exact=exact) == expected


def test_a_row_records_both_measurements_and_the_speed_ups_range():
    from ltm.ablation.switches import Change
    base, cand = _m(0.9, 1.1), _m(0.4, 0.6, loss=3.01)
    base.peak_memory, cand.peak_memory = 2 * 2**20, 2**20
    row = make_row(Change("train.opt.x=1", "exact", 0.1), "baseline", base, cand, "PASS", True, "")
    assert row["speedup"] == pytest.approx(2.0)
    assert row["speedup_low"] == pytest.approx(0.9 / 0.6) and row["speedup_high"] == pytest.approx(1.1 / 0.4)
    assert row["delta_val_loss"] == pytest.approx(0.01)
    assert (row["peak_memory_mib"], row["base_peak_memory_mib"]) == (1.0, 2.0)
