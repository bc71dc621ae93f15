"""ltm.train.time_to_target: the first evaluation at or below a target, optimisers compared at
fixed targets, and the figure that draws validation loss against seconds and tokens."""
import pytest

from ltm.report.figures import time_to_loss_figure
from ltm.train.time_to_target import score_ttt, time_to_target

def test_time_to_target_takes_the_first_evaluation_at_or_below_it():
    history = [{"split": "train", "step": 1, "loss": 1.0},
               {"split": "val", "step": 2, "loss": 3.0, "train_seconds": 1.5, "tokens": 20},
               {"split": "val", "step": 4, "loss": 2.0, "train_seconds": 3.0, "tokens": 40},
               {"split": "val", "step": 6, "loss": 1.0, "train_seconds": 4.5, "tokens": 60}]
    assert time_to_target(history, None) == {}
    assert time_to_target(history, 2.0) == {"target_loss": 2.0, "time_to_target_s": 3.0,
                                            "tokens_to_target": 40, "steps_to_target": 4}
    assert time_to_target(history, 0.5)["time_to_target_s"] is None


def test_time_to_loss_figure_draws_each_configuration():
    rows = [{"loss": 3.0 - i, "train_seconds": 1.0 + i, "tokens": 10 * (i + 1)} for i in range(3)]
    fig = time_to_loss_figure({"adamw": rows, "muon": rows[:2]}, target=1.5)
    ax_time, ax_tokens = fig.axes[:2]
    assert len(ax_time.lines) == 3 and list(ax_tokens.lines[0].get_xdata()) == [10, 20, 30]


def _val_curve(losses, seconds):
    return [{"step": i, "split": "val", "loss": loss, "train_seconds": t, "tokens": 100 * (i + 1)}
            for i, (loss, t) in enumerate(zip(losses, seconds))]


def test_score_ttt_takes_adamws_best_run_and_the_worst_ratio_to_any_adamw_of_equal_quality():
    runs = {"adamw b8": {"optimizer": "adamw", "curve": _val_curve([5.0, 4.5, 4.2, 3.90], [2, 4, 6, 8])},
            "adamw b16": {"optimizer": "adamw", "curve": _val_curve([5.0, 4.5, 4.2, 3.93], [1, 2, 3, 4])},
            "muon": {"optimizer": "muon", "curve": _val_curve([4.8, 4.4, 4.0, 3.905], [0.5, 1, 1.5, 2])}}
    for run in runs.values():
        run["val_loss"] = run["curve"][-1]["loss"]
    ttt = {"runs": runs}
    score_ttt(ttt, tolerance=0.05, targets=[4.5, 4.2, 3.8])
    muon = runs["muon"]
    assert ttt["reference"] == "adamw b8" and ttt["target_loss"] == 3.90
    assert muon["speedup"] is None and muon["time_to_target_s"] is None  # 3.905 never reaches 3.90
    assert muon["final_minus_reference"] == pytest.approx(0.005) and muon["equal_quality"]
    assert muon["fixed_targets"] == {"4.5": 4.0, "4.2": 4.0, "3.8": None}
    assert muon["worst_vs_equal_adamw"] == 2.0  # against batch 16, 0.03 worse at the end
    score_ttt(ttt, tolerance=0.01, targets=[4.5, 4.2])  # batch 16 no longer of equal quality
    assert not runs["adamw b16"]["equal_quality"] and muon["worst_vs_equal_adamw"] == 4.0


def test_score_ttt_speedup_of_a_run_listed_before_the_reference():
    # the muon run comes first and AdamW's best (the reference) last
    runs = {"muon": {"optimizer": "muon", "curve": _val_curve([4.8, 4.0, 3.85], [1, 2, 3])},
            "adamw b16": {"optimizer": "adamw", "curve": _val_curve([5.0, 4.5, 3.95], [1, 2, 3])},
            "adamw b8": {"optimizer": "adamw", "curve": _val_curve([5.0, 4.2, 3.90], [2, 4, 6])}}
    for run in runs.values():
        run["val_loss"] = run["curve"][-1]["loss"]
    ttt = {"runs": runs}
    score_ttt(ttt, tolerance=0.05, targets=[4.2])
    assert ttt["reference"] == "adamw b8"
    assert runs["muon"]["speedup"] == 2.0  # 6 s against 3 s to 3.90
    assert runs["adamw b8"]["speedup"] == 1.0 and runs["adamw b16"]["speedup"] is None
