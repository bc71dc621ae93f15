"""`train.target_loss`: time to target, the training seconds and tokens to a validation loss, and
the comparison of optimisers at fixed targets (`gpu/levers_bench.py --parts ttt`).
"""
from __future__ import annotations


def time_to_target(history: list[dict], target: float | None) -> dict:
    """The first evaluation whose validation loss is <= target: its training seconds (evaluation
    and checkpoints left out), tokens and step; None each when never reached; {} when off."""
    if target is None:
        return {}
    hit = next((r for r in history if r["split"] == "val" and r["loss"] <= target), None)
    return {"target_loss": target,
            "time_to_target_s": None if hit is None else hit.get("train_seconds"),
            "tokens_to_target": None if hit is None else hit.get("tokens"),
            "steps_to_target": None if hit is None else hit["step"]}


def fixed_target_speedups(reference: list[dict], curve: list[dict], targets: list[float]) -> dict:
    """Reference's time / this run's time to each fixed validation loss both reach (None where
    either does not): the time-to-target ratio over a range of targets rather than at one."""
    out = {}
    for target in targets:
        a = time_to_target(reference, target).get("time_to_target_s")
        b = time_to_target(curve, target).get("time_to_target_s")
        out[str(target)] = a / b if a and b else None
    return out


def score_ttt(ttt: dict, tolerance: float, targets: list[float]) -> None:
    """Adds to a ttt record (its runs' validation curves) the reference, the target and each run's
    time to it, speedup, quality against the reference and speedups to the fixed targets. The
    reference is AdamW's best run (the lowest final loss of the AdamW runs; the first run when
    none is AdamW), so that a tuned AdamW, not its first setting, sets the target."""
    runs = ttt["runs"]
    adamw = [r for r in runs.values() if r.get("optimizer") == "adamw"] or [next(iter(runs.values()))]
    reference = min(adamw, key=lambda r: r["val_loss"])
    target = reference["val_loss"]
    # the reference's own time first: a run listed before it needs it too
    a = time_to_target(reference["curve"], target).get("time_to_target_s")
    for name, run in runs.items():
        run.setdefault("name", name)
        run.update(time_to_target(run["curve"], target))
        b = run.get("time_to_target_s")
        run["speedup"] = a / b if a and b else None
        # equal final quality as the ablate protocol judges another optimiser (an approximate
        # switch): at most ablate.loss_tolerance worse than the reference's final loss
        run["final_minus_reference"] = run["val_loss"] - reference["val_loss"]
        run["equal_quality"] = run["final_minus_reference"] <= tolerance
        run["fixed_targets"] = fixed_target_speedups(reference["curve"], run["curve"], targets)
    # the fair figure: against every AdamW run of equal quality (not only the best one, which
    # may be slow: a larger batch can reach the same targets sooner and end within tolerance),
    # the smallest speedup at a fixed target both reach
    equal_adamw = [r for r in runs.values() if r.get("optimizer") == "adamw" and r["equal_quality"]]
    for run in runs.values():
        ratios = [x for a in equal_adamw if a is not run
                  for x in fixed_target_speedups(a["curve"], run["curve"], targets).values() if x]
        run["worst_vs_equal_adamw"] = min(ratios) if ratios else None
    ttt.update(target_loss=target, reference=reference["name"], tolerance=tolerance,
               fixed_targets=targets)
