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


@pytest.mark.parametrize("blocks, factor, expected", [
    ([[1.0], [3.5]], 3.0, True),          # the candidate 3.5x slower after one round
    ([[3.5], [1.0]], 3.0, True),          # ... or 3.5x faster
    ([[1.0, 1.2], [3.5, 3.4]], 3.0, False),  # 3.4 < 3 x 1.2: not settled
    ([[1.0], [2.0]], 3.0, False),
    ([[1.0], [30.0]], None, False),       # null: never settle early
    ([[1.0], [3.5], [4.0]], 3.0, False),  # the rule is for a baseline-candidate pair only
])
def test_settled_needs_a_gap_of_the_factor_between_the_spreads(blocks, factor, expected):
    from ltm.ablation.measure import settled
    assert settled(blocks, factor) is expected


class _FakeRunner:
    """A runner whose every timed step takes `step_s` (no training)."""

    def __init__(self, step_s: float) -> None:
        self.step_s, self.steps = step_s, 0

    def tokens_per_step(self) -> int:
        return 1

    def reset(self) -> None:
        self.steps = 0

    def step(self) -> None:
        self.steps += 1

    def memory_step(self):
        self.steps += 1
        return None, "not measured"

    def timed_steps(self, n: int, timer) -> list[float]:
        self.steps += n
        return [self.step_s] * n

    def finish(self) -> float:
        return float(self.steps)  # the "score" records how far the runner trained


@pytest.mark.parametrize("cand_s, factor, blocks", [(20.0, 3.0, 1), (1.5, 3.0, 5), (20.0, None, 5)])
def test_measure_stops_a_settled_pair_with_both_at_the_same_step(cand_s, factor, blocks):
    from ltm.ablation.measure import measure
    from ltm.ablation.switches import AblateConfig
    cfg = AblateConfig(warmup=2, steps=4, repeats=5, settle_factor=factor)
    base, cand = measure([_FakeRunner(1.0), _FakeRunner(cand_s)], cfg, timer=None)
    assert base.blocks == cand.blocks == blocks
    # equal training before the quality score: warm-up steps plus the blocks run
    assert base.val_loss == cand.val_loss == 2 + 4 * blocks
    assert cand.step_s == cand_s


def test_settle_factor_must_exceed_one():
    from ltm.ablation.switches import AblateConfig
    from ltm.params import ParamsError
    with pytest.raises(ParamsError, match="settle_factor"):
        AblateConfig(settle_factor=1.0)
