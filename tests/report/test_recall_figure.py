"""ltm.report.recall_figure: the recall figure names its device and commit and marks the window,
and the summary line names the best mixer beyond the window against sliding-window attention."""
import pandas as pd

from ltm.report.recall_figure import recall_figure, recall_summary, window_margins

BINS = [(0, 16, "1-16 (within window)"), (16, 32, "17-32 (1-2x window)"),
        (32, 64, "33-64 (2-4x window)"), (64, 128, "65-128 (> 4x window)")]
ACCURACY = {"attention": [0.9, 0.8, 0.8, 0.7], "attention:window": [0.9, 0.05, 0.03, 0.03],
            "deltanet": [0.6, 0.5, 0.4, 0.3]}


def table() -> pd.DataFrame:
    return pd.DataFrame([{"mixer": m, "params": 1000, "bin": label, "low": lo, "high": hi,
                          "accuracy": acc[i], "se": 0.01, "n": 100, "correct": round(100 * acc[i])}
                         for m, acc in ACCURACY.items() for i, (lo, hi, label) in enumerate(BINS)])


def metrics() -> dict:
    far = {"attention": 0.75, "attention:window": 0.031, "deltanet": 0.35}
    return {"enabled": True, "device": "cpu", "seconds": 90.0, "chance": 0.031,
            "settings": {"window": 16, "n_pairs": 8, "seq_len": 128, "steps": 300, "n_layers": 2,
                         "eval_sequences": 256},
            "best_beyond_window": {"mixer": "attention", "accuracy": 0.75, "se": 0.012},
            "by_mixer": {m: {"beyond_window": {"accuracy": a, "se": 0.012, "n": 300}}
                         for m, a in far.items()}}


def test_the_figure_names_device_and_commit_and_marks_the_window():
    curve = pd.DataFrame({"mixer": ["attention"] * 3, "step": [0, 1, 2], "loss": [3.0, 2.0, 1.0]})
    fig = recall_figure(table(), metrics(), curve, commit="0123456789abcdef")
    assert fig._suptitle.get_text() == "recall against distance (cpu, commit 01234567)"
    ax = fig.axes[0]
    assert any(list(line.get_xdata()) == [16, 16] for line in ax.get_lines())
    assert len(fig.axes) == 2 and recall_figure(table(), metrics()).axes[0].get_xscale() == "log"


def test_the_summary_line_names_the_best_beyond_the_window_with_its_se():
    assert recall_summary(metrics()) == (
        "Recall beyond the 16-token window: best attention 0.750 ± 0.012 (sliding-window "
        "attention 0.031 ± 0.012); chance 0.031.")

def test_a_memory_beside_the_window_gets_its_margin_over_sliding_window_attention():
    m = metrics()
    assert window_margins(m) == []  # no margins recorded (no `:window` memory was run)
    m["margins_over_sliding_window"] = {"titans:window": {"difference": 0.056, "se": 0.01,
                                                          "per_seed": [0.05, 0.062]}}
    m["settings"]["seeds"] = 2
    assert window_margins(m) == [
        "titans:window minus sliding-window attention beyond the window: +0.056 ± 0.010 (5.6 "
        "standard errors; the spread over 2 training seeds and the evaluation's sampling)"]
    assert recall_summary(m).endswith("chance 0.031. " + window_margins(m)[0] + ".")
    m["settings"]["seeds"] = 1
    assert window_margins(m)[0].endswith("(5.6 standard errors; evaluation noise only, one "
                                         "training seed)")
