"""The ablate protocol's switches: which parameters a switch may change, each declared exact (the
same maths) or approximate (another function) with its tolerance, the `ablate:` settings
(AblateConfig), and a switch applied to the model and train sections.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Literal

from ltm.model.config import ModelConfig
from ltm.params import ParamsError, apply_override, check, from_mapping
from ltm.train.settings import TrainConfig

# sections a switch may change
SWITCHABLE = ("model", "train")
KINDS = ("exact", "approximate")

# Every parameter a switch may change, declared exact (the same maths: only speed and memory may
# move, the score only by float rounding) or approximate (another function), with its tolerance on
# the validation loss (None: ablate.exact_tolerance or ablate.loss_tolerance). ablate.registry in
# params adds or overrides entries. The extension point for new switches (the roadmap's
# hierarchical-DeltaNet ones, once ltm/model/mixers.py exposes them as model parameters): one line here.
REGISTRY: dict[str, tuple[str, float | None]] = {
    "train.opt.compile": ("exact", None),
    "train.opt.fused_adamw": ("exact", None),
    "train.opt.fused_loss": ("exact", None),
    "train.opt.workers": ("exact", None),
    "train.opt.pin_memory": ("exact", None),
    "train.opt.compile_mode": ("exact", None),  # the same graph, launched from CUDA graphs
    "train.opt.fused_ops": ("exact", None),  # the same maths in fused kernels (float32 inside)
    "model.checkpointing": ("exact", None),
    "model.kernel": ("exact", None),  # the same recurrence, summed in another order
    "model.chunk_size": ("exact", None),  # the chunked form is exact algebra for any chunk
    "model.fused_conv": ("exact", None),
    "train.opt.amp": ("approximate", None),  # bf16 / fp16 rounding of activations
    "train.opt.tf32": ("approximate", None),  # 10-bit mantissa matmul inputs
    "train.opt.pretokenized": ("approximate", None),  # other random windows of the same text
    "train.batch_size": ("approximate", None),
    "train.opt.fp8": ("approximate", None),  # float8 matmul inputs (scaled e4m3 / e5m2)
    "train.optimizer": ("approximate", None),  # another optimiser: other weights after the steps
    "train.muon_lr": ("approximate", None),
    "model.mixer": ("approximate", None),  # another architecture: its weights are not trained
    "model.window": ("approximate", None),
    "model.short_conv": ("approximate", None),
    "model.hierarchical": ("approximate", None),
    # the roadmap's switches of the hierarchical DeltaNet (tests/test_hierarchical.py)
    "model.hier_op": ("exact", None),  # dual op: the stacked path's function, q, k, v read once
    "model.fused_proj": ("exact", None),  # one matmul over the two projection weights
    "model.hier_mix": ("approximate", None),  # sum: no learned fast/slow gate
    "model.hier_fast_read": ("approximate", None),  # chunk: fast state read at chunk starts only
    "model.hier_slow_threshold": ("approximate", None),  # event-driven slow state
}


@dataclass
class AblateConfig:
    mode: Literal["one_at_a_time", "cumulative"] = "cumulative"
    # baseline training when the train stage left no checkpoint that fits the model section
    warm_start_steps: int = 150
    # untimed steps of each measurement (compilation, allocator); the last one measures memory
    warmup: int = 3
    steps: int = 8  # timed steps per block (their median is the block's step time)
    repeats: int = 5  # blocks per measurement; their spread decides NO EFFECT
    # stop a measurement early once one side's fastest block is this many times slower than the
    # other's slowest (bf16 autocast on a CPU: 17x; five blocks of it cost 100 s); null = never
    settle_factor: float | None = 3.0
    val_sequences: int = 32  # the fixed validation set: the first N windows of the val split
    exact_tolerance: float = 0.001  # |delta val loss| allowed to an exact switch
    loss_tolerance: float = 0.05  # ... and to an approximate one
    # "section.key": {kind: exact | approximate, tolerance: float or null}, over REGISTRY
    registry: dict[str, dict] = field(default_factory=dict)
    # assignments applied to the model and train sections before the baseline is measured
    baseline: list[str] = field(default_factory=list)
    profile_steps: int = 2  # profiled steps of the baseline and the final configuration; 0 = none
    # no new row after this many seconds (later changes: SKIPPED); null = no limit. A latent main
    # model (16 inner steps a step) makes every row minutes long on a CPU
    time_budget_s: float | None = 900.0
    # latent models: exact switches may move the score this many times the rounding probe's
    # delta (Protocol.rounding_probe: the inner loop amplifies float rounding)
    rounding_factor: float = 3.0
    # each entry, one or more space-separated "section.key=value", is one change
    # (the CPU default: about 800 training steps in all, some two minutes at the train stage's
    # speed on two idle cores; compile is left to the GPU list in configs/gpu.yaml, compiling
    # alone takes minutes on two cores)
    switches: list[str] = field(default_factory=lambda: [
        "train.opt.fused_adamw=true", "train.opt.fused_loss=true", "train.opt.workers=1",
        "model.kernel=naive", "model.checkpointing=true", "train.opt.amp=bf16",
        "train.opt.pretokenized=false", "model.mixer=deltanet"])

    def __post_init__(self) -> None:
        for name in ("steps", "repeats", "val_sequences"):
            check(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        for name in ("warm_start_steps", "warmup", "profile_steps"):
            check(getattr(self, name) >= 0, name, f"must be >= 0, got {getattr(self, name)}")
        check(self.warmup >= 1, "warmup", f"must be >= 1 (its last step measures memory), "
              f"got {self.warmup}")
        for name in ("exact_tolerance", "loss_tolerance"):
            check(getattr(self, name) >= 0, name, f"must be >= 0, got {getattr(self, name)}")
        check(self.settle_factor is None or self.settle_factor > 1, "settle_factor",
              f"must be > 1 or null, got {self.settle_factor}")
        check(self.rounding_factor >= 0, "rounding_factor", f"must be >= 0, got {self.rounding_factor}")
        check(self.time_budget_s is None or self.time_budget_s > 0, "time_budget_s",
              f"must be > 0 or null, got {self.time_budget_s}")
        for key, entry in self.registry.items():
            ok = (isinstance(entry, dict) and set(entry) <= {"kind", "tolerance"}
                  and entry.get("kind") in KINDS
                  and (entry.get("tolerance") is None or
                       isinstance(entry["tolerance"], (int, float)) and entry["tolerance"] >= 0))
            check(ok, f"registry.{key}", "expected {kind: exact or approximate, tolerance: "
                  f"a number >= 0 or null}}, got {entry!r}")


@dataclass
class Change:
    text: str  # the switch as written in params
    kind: str
    tolerance: float


def describe_change(text: str, cfg: AblateConfig, where: str) -> Change:
    """Kind and tolerance of a switch: approximate if any of its assignments is; the largest
    tolerance of its assignments."""
    registry = {**{k: {"kind": kind, "tolerance": tol} for k, (kind, tol) in REGISTRY.items()},
                **cfg.registry}
    kinds, tolerances = [], []
    for assignment in text.split():
        key = assignment.partition("=")[0].strip()
        if key not in registry:
            raise ParamsError(f"{where}: '{key}' is not in the switch registry; declare it under "
                              "ablate.registry as {kind: exact or approximate, tolerance: ...}")
        entry = registry[key]
        kinds.append(entry["kind"])
        default = cfg.exact_tolerance if entry["kind"] == "exact" else cfg.loss_tolerance
        tolerances.append(default if entry.get("tolerance") is None else float(entry["tolerance"]))
    kind = "approximate" if "approximate" in kinds else "exact"
    return Change(text, kind, max(tolerances))


def apply_switch(sections: dict, switch: str, where: str) -> dict:
    """A deep copy of `sections` with the switch's assignments applied. A switch is one or more
    space-separated 'section.key=value' assignments in the model or train section."""
    changed = copy.deepcopy(sections)
    for assignment in switch.split():
        if assignment.partition(".")[0] not in SWITCHABLE:
            raise ParamsError(f"{where}: '{assignment}' must change the model or train section")
        apply_override(changed, assignment, where)
    return changed


def variant_configs(sections: dict, where: str) -> tuple[ModelConfig, TrainConfig]:
    """Validated configs of one variant; never resumed, never checkpointed."""
    train = dict(sections.get("train") or {}, resume=False, checkpoint_every=0)
    model_cfg = from_mapping(ModelConfig, sections.get("model"), f"{where} model")
    train_cfg = from_mapping(TrainConfig, train, f"{where} train")
    return model_cfg, train_cfg
