"""The ablate protocol (the roadmap's; its stage is ltm.stages.ablate): start from a trained model with a fixed quality
score, make one change, rerun the quick test, keep the change only if the score is preserved
(within the switch's tolerance) and the step time is below the previous one beyond the spread of
the measurements; then the next change on top of it (mode cumulative) or on top of the baseline
(mode one_at_a_time). The baseline and the final configuration are profiled per operation group.

A measurement (ltm.ablation.runner.Runner) starts from the train stage's checkpoint (or a warm-start run
of ablate.warm_start_steps steps when there is none that fits), runs `warmup` untimed steps (the
last one measures peak memory), then `repeats` blocks of `steps` timed steps; the step time is
the median of the blocks' median step times, the spread their min and max. A pair stops after
the round whose blocks are `settle_factor` times apart (the verdict cannot change but towards
NO EFFECT, and not across such a gap). The quality score is the mean loss on a fixed validation
set after the same steps. The current baseline and the
candidate are measured in alternating blocks, so slow drift of the machine hits both alike.

Verdicts: FAIL (quality out of tolerance: either way for an exact switch, worse for an
approximate one; or the variant failed to run), PASS (faster beyond the
spread: the candidate's slowest block beats the baseline's fastest), SLOWER (the reverse), NO
EFFECT (the spreads overlap).
"""
from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd
import torch

from ltm.train import checkpoint as ckpt
from ltm.data.batches import with_vocab
from ltm.params import ParamsError
from ltm.ablation.measure import Measurement, make_row, measure, verdict
from ltm.ablation.switches import AblateConfig, Change, apply_switch, describe_change, variant_configs
from ltm.ablation.runner import Runner, StepTimer, fits, profile_runner, real_step_timer
from ltm.train.settings import TrainingDiverged
from ltm.train.trainer import run_training

def one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]


class Protocol:
    """The loop over the changes: each measured against the current baseline, which a PASS
    replaces in cumulative mode."""

    def __init__(self, cfg: AblateConfig, sections: dict, cache_dir: str, state: dict, tmp: str,
                 timer: StepTimer, deadline: float | None, on_row: Callable | None) -> None:
        self.cfg, self.sections, self.cache_dir, self.state, self.tmp = cfg, sections, cache_dir, state, tmp
        self.timer, self.deadline, self.on_row = timer, deadline, on_row
        self.rows: list[dict] = []
        self.baseline_row: dict | None = None
        self.rounding: float | None = None  # rounding_probe's result

    def rounding_probe(self, origin: Runner) -> float | None:
        """A latent model's training passes through the inner loop, whose Adam steps amplify float
        rounding (its score no longer does: Runner.latent_score): an exact switch that only rounds
        differently (fused AdamW, the fused loss) may move it beyond ablate.exact_tolerance.
        Measured here as |delta score| of the baseline
        against itself with every weight moved by one float32 rounding step (relative 2^-23,
        random sign); exact switches of a latent model are then allowed rounding_factor x that.
        None for a plain model (no inner loop: rounding stays rounding)."""
        if origin.trainer.model_cfg.n_latent == 0:
            return None
        gen = torch.Generator().manual_seed(0)
        eps = torch.finfo(torch.float32).eps

        def nudge(t):
            if not torch.is_tensor(t) or not t.is_floating_point():
                return t
            sign = torch.randint(0, 2, t.shape, generator=gen).to(t.device, t.dtype) * 2 - 1
            return t * (1 + eps * sign)

        nudged = {**self.state, "model": {k: nudge(v) for k, v in self.state["model"].items()}}
        probe = Runner(origin.trainer.model_cfg, origin.trainer.cfg, self.cache_dir, nudged,
                       self.cfg.val_sequences, self.tmp)
        base, other = measure([origin, probe], self.cfg, self.timer)
        probe.close_loader()
        self.rounding = abs(other.val_loss - base.val_loss)
        print(f"ablate: rounding probe (latent model): one float32 rounding step of every weight "
              f"moves the score by {self.rounding:.3g}", flush=True)
        return self.rounding

    def runner(self, sections: dict, where: str) -> Runner:
        model_cfg, train_cfg = variant_configs(sections, where)
        cfg = self.cfg
        # the loader and the lr schedule run to the end of the longest measurement
        steps = self.state["step"] + cfg.warmup + max(cfg.repeats * cfg.steps, cfg.profile_steps)
        train_cfg = dataclasses.replace(train_cfg, steps=steps)
        return Runner(model_cfg, train_cfg, self.cache_dir, self.state, cfg.val_sequences, self.tmp)

    def compare(self, base: Runner, change: Change, sections: dict, against: str,
                where: str) -> tuple[dict, Runner | None]:
        """One row: the candidate measured against `base`; the candidate's runner if it passed."""
        cand = None
        if change.kind == "exact" and self.rounding:
            change = Change(change.text, change.kind,
                            max(change.tolerance, self.cfg.rounding_factor * self.rounding))
        try:
            cand = self.runner(sections, where)
            base_m, cand_m = measure([base, cand], self.cfg, self.timer)
            result = verdict(base_m, cand_m, change.tolerance, change.kind == "exact")
            notes = [] if cand.loaded == "all" else [f"weights loaded: {cand.loaded} (untrained rest)"]
            if cand_m.blocks < self.cfg.repeats:
                notes.append(f"settled after {cand_m.blocks} of {self.cfg.repeats} blocks "
                             f"(a gap over ablate.settle_factor {self.cfg.settle_factor}x)")
            note = "; ".join(notes)
        except (ParamsError, TrainingDiverged, RuntimeError, ValueError, NotImplementedError) as err:
            # a variant that cannot run here fails its row, not the whole ablation
            base_m, cand_m, result, note = Measurement(), Measurement(), "FAIL", one_line(err)
        keep = result == "PASS" and self.cfg.mode == "cumulative"
        if self.baseline_row is None and against == "baseline" and base_m.step_s == base_m.step_s:
            self.baseline_row = make_row(Change("baseline", "exact", 0.0), "baseline", base_m,
                                         base_m, "BASELINE", True, "")
        row = make_row(change, against, base_m, cand_m, result, keep, note)
        print(f"ablate: {change.text}: {result} (speed-up {row['speedup']:.3f}, "
              f"delta val loss {row['delta_val_loss']:+.2e}){' ' + note if note else ''}",
              flush=True)
        if not keep and cand is not None:
            cand.close_loader()
            cand = None
        return row, cand

    def run(self, changes: list[Change]) -> tuple[Runner, Runner, list[Change]]:
        origin = self.runner(self.sections, "baseline")
        self.rounding_probe(origin)
        current, sections, kept = origin, self.sections, []
        for i, change in enumerate(changes):
            against = " + ".join(["baseline"] + [c.text for c in kept])
            if self.deadline is not None and time.monotonic() > self.deadline:
                self.rows.append(make_row(change, against, Measurement(), Measurement(),
                                          "SKIPPED", False, "time budget spent"))
                continue
            where = f"ablate.switches[{i}]"
            candidate = apply_switch(sections, change.text, where)
            row, passed = self.compare(current, change, candidate, against, where)
            self.rows.append(row)
            if passed is not None:
                current, sections = passed, candidate
                kept.append(change)
            if self.on_row:
                self.on_row(self.rows)
        return origin, current, kept


def baseline_state(cfg: AblateConfig, sections: dict, cache_dir: str,
                   checkpoint_dir: str | Path | None, tmp: str) -> tuple[dict, str]:
    """The trained model every measurement starts from: the train stage's checkpoint if it holds
    the model section's model, else a warm-start run of warm_start_steps steps."""
    model_cfg, train_cfg = variant_configs(sections, "baseline")
    source = "synthetic" if train_cfg.data == "synthetic" else "cache"
    path = Path(checkpoint_dir) / ckpt.CHECKPOINT_FILE if checkpoint_dir else None
    saved = ckpt.load_checkpoint(path) if path else None
    if saved is not None and fits(with_vocab(model_cfg, cache_dir, source), saved["model"]):
        return saved, f"the train stage's checkpoint {path} (step {saved['step']})"
    why = ("no checkpoint folder given" if path is None else f"no checkpoint at {path}"
           if saved is None else f"the checkpoint at {path} holds another model")
    if cfg.warm_start_steps == 0:
        raise ParamsError(f"ablate.warm_start_steps: is 0 and there is no baseline to start "
                          f"from ({why})")
    print(f"ablate: {why}; training the baseline for {cfg.warm_start_steps} steps", flush=True)
    warm = dataclasses.replace(train_cfg, steps=cfg.warm_start_steps, resume=False,
                               eval_every=cfg.warm_start_steps, checkpoint_every=0)
    result = run_training(model_cfg, warm, cache_dir, str(Path(tmp) / "warm"), progress=False)
    return ckpt.load_checkpoint(result.checkpoint), f"a warm start of {cfg.warm_start_steps} steps ({why})"


@dataclass
class Ablation:
    table: pd.DataFrame  # one row per change, the baseline first (and the final configuration)
    profile: pd.DataFrame  # (config, group, ms): milliseconds per step in each group
    info: dict  # how it was measured


def ablate(cfg: AblateConfig, sections: dict, cache_dir: str,
           checkpoint_dir: str | Path | None = None, timer: StepTimer = real_step_timer,
           deadline: float | None = None, on_row: Callable | None = None) -> Ablation:
    """Run the protocol on the model and train `sections`. deadline (time.monotonic()): later
    changes are SKIPPED; on_row(rows) is called after each row."""
    started = time.perf_counter()
    for i, assignment in enumerate(cfg.baseline):
        sections = apply_switch(sections, assignment, f"ablate.baseline[{i}]")
    variant_configs(sections, "baseline")
    changes = []
    for i, text in enumerate(cfg.switches):
        where = f"ablate.switches[{i}]"
        # a bad switch fails before minutes are spent on the ones before it
        variant_configs(apply_switch(sections, text, where), where)
        changes.append(describe_change(text, cfg, where))
    with tempfile.TemporaryDirectory() as tmp:
        state, source = baseline_state(cfg, sections, cache_dir, checkpoint_dir, tmp)
        protocol = Protocol(cfg, sections, cache_dir, state, tmp, timer, deadline, on_row)
        origin, final, kept = protocol.run(changes)
        if protocol.baseline_row is None:  # no change measured: the baseline alone
            (base,) = measure([origin], cfg, timer)
            protocol.baseline_row = make_row(Change("baseline", "exact", 0.0), "baseline", base,
                                             base, "BASELINE", True, "")
        rows = [protocol.baseline_row] + protocol.rows
        if kept:
            rows.append(final_row(origin, final, kept, cfg, timer))
        profile, profile_wall = profiles(origin, final, cfg)
        device = origin.trainer.device
    info = {"mode": cfg.mode, "baseline": source, "device": str(device),
            "warmup": cfg.warmup, "steps": cfg.steps, "repeats": cfg.repeats,
            "val_sequences": cfg.val_sequences, "kept": [c.text for c in kept],
            "rounding_probe": protocol.rounding,
            "score": ("latent model: NLL per token given z drawn from the prior with fixed seeds "
                      "(no inference)" if origin.trainer.model_cfg.n_latent else "NLL per token"),
            "profile_step_ms": profile_wall,
            "seconds": round(time.perf_counter() - started, 1)}
    return Ablation(pd.DataFrame(rows), profile, info)


def profiles(origin: Runner, final: Runner, cfg: AblateConfig) -> tuple[pd.DataFrame, dict]:
    """The per-group profile of the baseline and of the final configuration (config, group,
    ms), and the wall ms per profiled step of each."""
    runners = {"baseline": origin} | ({"final": final} if final is not origin else {})
    rows, wall = [], {}
    for name, runner in runners.items() if cfg.profile_steps else ():
        groups, wall[name] = profile_runner(runner, cfg.warmup, cfg.profile_steps)
        rows += [{"config": name, "group": group, "ms": ms} for group, ms in groups.items()]
    return pd.DataFrame(rows, columns=["config", "group", "ms"]), wall


def final_row(origin: Runner, final: Runner, kept: list[Change], cfg: AblateConfig,
              timer: StepTimer) -> dict:
    """The accepted changes together against the original baseline; their tolerances add."""
    base, cand = measure([origin, final], cfg, timer)
    kind = "approximate" if any(c.kind == "approximate" for c in kept) else "exact"
    change = Change("final: " + " + ".join(c.text for c in kept), kind,
                    sum(c.tolerance for c in kept))
    result = verdict(base, cand, change.tolerance, kind == "exact")
    return make_row(change, "baseline", base, cand, result, True, "")


def write_outputs(result: Ablation, metrics_path: str | Path, plot_path: str | Path) -> None:
    """Metrics keyed by change (so `dvc metrics diff` names the verdict that moved), the
    per-group profile and the protocol's settings; the plot table one row per change."""
    def plain(value):
        return None if isinstance(value, float) and value != value else value
    keys = ("verdict", "kind", "tolerance", "kept", "speedup", "speedup_low", "speedup_high",
            "step_ms", "val_loss", "delta_val_loss", "peak_memory_mib", "note")
    metrics = {row["switch"]: {k: plain(row[k]) for k in keys}
               for row in result.table.to_dict("records")}
    metrics["profile"] = {name: dict(zip(rows["group"], rows["ms"].round(3)))
                          for name, rows in result.profile.groupby("config", sort=False)}
    metrics["protocol"] = result.info
    for path in (metrics_path, plot_path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(metrics_path).write_text(json.dumps(metrics, indent=1, default=float) + "\n")
    result.table.to_csv(plot_path, index=False)
