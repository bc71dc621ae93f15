"""One measurement of the ablate protocol (ltm.ablation.protocol): runners measured from the checkpoint in
alternating timed blocks, the verdict on a candidate against its baseline, and the table row
that records both."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from ltm.ablation.runner import Runner, StepTimer
from ltm.ablation.switches import AblateConfig, Change


@dataclass
class Measurement:
    step_s: float = float("nan")  # median of the blocks' median step times
    low_s: float = float("nan")  # the fastest block's median
    high_s: float = float("nan")  # the slowest block's median
    val_loss: float = float("nan")  # the quality score
    peak_memory: float | None = None  # bytes
    memory_kind: str = "not measured"
    tokens_per_step: int = 0
    blocks: int = 0  # timed blocks run (fewer than ablate.repeats when the verdict settled early)


def settled(blocks: list[list[float]], factor: float | None) -> bool:
    """Whether a baseline-candidate pair's speed verdict is already decided: one side's fastest
    block `factor` times slower than the other's slowest. More blocks only widen both spreads (a
    verdict can only move towards NO EFFECT), so the rule asks for a gap several times the widest
    block spread seen on a busy machine (1.7x) rather than any gap at all."""
    if factor is None or len(blocks) != 2:
        return False
    base, cand = blocks
    return min(cand) >= factor * max(base) or min(base) >= factor * max(cand)


def measure(runners: list[Runner], cfg: AblateConfig, timer: StepTimer) -> list[Measurement]:
    """Measure each runner from the checkpoint, their timed blocks alternating; a pair stops
    after the round that settles its speed verdict (`settled`), both at the same step, so the
    quality scores still compare equal training."""
    results = [Measurement(tokens_per_step=r.tokens_per_step()) for r in runners]
    for runner, result in zip(runners, results):
        runner.reset()
        for _ in range(cfg.warmup - 1):
            runner.step()
        result.peak_memory, result.memory_kind = runner.memory_step()
    blocks: list[list[float]] = [[] for _ in runners]
    for _ in range(cfg.repeats):
        for runner, times in zip(runners, blocks):
            times.append(statistics.median(runner.timed_steps(cfg.steps, timer)))
        if settled(blocks, cfg.settle_factor):
            break
    for runner, result, times in zip(runners, results, blocks):
        result.step_s, result.low_s, result.high_s = statistics.median(times), min(times), max(times)
        result.blocks = len(times)
        result.val_loss = runner.finish()
    return results


def verdict(base: Measurement, cand: Measurement, tolerance: float, exact: bool = True) -> str:
    """FAIL: quality out of tolerance; PASS / SLOWER: faster / slower beyond both spreads;
    NO EFFECT: the spreads overlap. The tolerance is two-sided for an exact switch (same maths:
    any move beyond rounding is a bug) and one-sided for an approximate one (another function:
    only a worse validation loss fails it; a better one preserves quality)."""
    delta = cand.val_loss - base.val_loss
    moved = abs(delta) if exact else delta
    if not delta == delta or moved > tolerance:  # NaN fails too
        return "FAIL"
    if cand.high_s < base.low_s:
        return "PASS"
    if cand.low_s > base.high_s:
        return "SLOWER"
    return "NO EFFECT"


def make_row(change: Change, against: str, base: Measurement, cand: Measurement, result: str,
             kept: bool, note: str) -> dict:
    mib = lambda m: None if m.peak_memory is None else round(m.peak_memory / 2**20, 2)
    return {
        "switch": change.text, "kind": change.kind, "tolerance": change.tolerance,
        "against": against, "verdict": result, "kept": kept,
        "speedup": base.step_s / cand.step_s,
        # the ratio's range over both spreads
        "speedup_low": base.low_s / cand.high_s, "speedup_high": base.high_s / cand.low_s,
        "step_ms": 1e3 * cand.step_s, "step_ms_min": 1e3 * cand.low_s,
        "step_ms_max": 1e3 * cand.high_s, "base_step_ms": 1e3 * base.step_s,
        "base_step_ms_min": 1e3 * base.low_s, "base_step_ms_max": 1e3 * base.high_s,
        "tokens_per_s": cand.tokens_per_step / cand.step_s if cand.tokens_per_step else None,
        "val_loss": cand.val_loss, "base_val_loss": base.val_loss,
        "delta_val_loss": cand.val_loss - base.val_loss,
        "peak_memory_mib": mib(cand), "base_peak_memory_mib": mib(base),
        "peak_memory_kind": cand.memory_kind, "note": note,
    }
