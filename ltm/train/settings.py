"""The train stage's settings: `train` (TrainConfig), its speed switches `train.opt` (OptConfig,
decided per device as Switches) and the models beside it `train.counterpart` (CounterpartConfig);
the result of a run and the error a diverged run raises. The pieces a run is built from (optimisers,
schedule, float8, fused ops) are their own modules of ltm.train and read these settings.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from ltm.data.cache import cache_dir_of
from ltm.latent.posterior import LatentConfig
from ltm.model.lm import ModelConfig
from ltm.params import apply_override, check, from_mapping, read_params

Auto = Literal["auto"]


OPTIMIZERS = ("adamw", "muon")
# train.opt.fused_ops (ltm.train.fused_ops; named here so that checking params imports no Triton)
FUSED_OPS = ("rms_norm", "swiglu", "rope", "cross_entropy")
# train.opt.fp8's groups of linears (ltm.train.float8), each a superset of the one before
FP8_CHOICES = ("mlp", "blocks", "all")


@dataclass
class OptConfig:
    """`train.opt`: speed switches, each independent. auto = on for CUDA, off for the CPU, except
    fused_loss: auto = off everywhere (on an H200 the compiled plain loss was 11% faster)."""

    amp: Literal["auto", "off", "bf16", "fp16"] = "auto"  # mixed precision; fp16 adds a grad scaler
    tf32: bool | Auto = "auto"  # TF32 tensor cores for float32 matmuls (CUDA only)
    compile: bool | Auto = "auto"  # torch.compile the model and loss (and Muon's step)
    fused_adamw: bool | Auto = "auto"  # one fused kernel for the whole AdamW update
    workers: int = 0  # processes preparing batches ahead (0 = in the training loop)
    pin_memory: bool | Auto = "auto"  # page-locked batches, copied with non_blocking (CUDA only)
    pretokenized: bool = True  # false = tokenise raw text for every batch (the baseline)
    fused_loss: bool | Auto = "auto"  # chunked cross-entropy, no full-vocabulary logits
    # torch.compile's mode: default | reduce-overhead (CUDA graphs of the forward and backward)
    # | max-autotune | max-autotune-no-cudagraphs; with compile on only
    compile_mode: Literal["default", "reduce-overhead", "max-autotune",
                          "max-autotune-no-cudagraphs"] = "default"
    # torchao float8 training (CUDA, SM 8.9+) of: true / blocks = every block linear, mlp = the
    # MLPs' only, all = the block linears and the (tied) head; false = none
    fp8: bool | Literal["mlp", "blocks", "all"] = False
    # fused kernels (ltm.train.fused_ops): some of rms_norm, swiglu, rope, cross_entropy
    fused_ops: list[str] = field(default_factory=list)

    def __post_init__(self):
        check(self.workers >= 0, "workers", f"must be >= 0, got {self.workers}")
        unknown = [op for op in self.fused_ops if op not in FUSED_OPS]
        check(not unknown, "fused_ops", f"unknown {unknown}; expected some of {list(FUSED_OPS)}")


@dataclass
class CounterpartConfig:
    """`train.counterpart`: what is trained beside the configured model. Defaults: the CPU
    default's, which must fit the pipeline's minutes."""

    enabled: bool = True
    # latents per layer of the latent counterpart (when model.n_latent is 0)
    n_latent: int = 4
    # inner steps of the latent counterpart; null = train.latent.steps (the authors' 16). The CPU
    # default takes 1: each inner step costs about one plain training step
    latent_steps: int | None = 1
    # the latent model's bound and prefix NLL by inference steps; null = train.latent.eval_steps
    eval_steps: list[int] | None = field(default_factory=lambda: [0, 1, 2, 4, 16])
    # validation batches of those curves; null = train.latent.eval_batches
    eval_batches: int | None = 2
    # also a plain model trained for as many FLOPs as the latent model (more steps, its own
    # schedule), when it needs at most max_equal_flops_steps steps
    equal_flops: bool = True
    max_equal_flops_steps: int = 400
    # models trained at once on a CPU, a process each (0: one per core); GPU: 1, in turn
    workers: int = 0

    def __post_init__(self):
        check(self.n_latent >= 1, "n_latent", f"must be >= 1, got {self.n_latent}")
        check(self.latent_steps is None or self.latent_steps >= 1, "latent_steps",
              f"must be >= 1 or null, got {self.latent_steps}")
        check(self.eval_steps is None or all(s >= 0 for s in self.eval_steps), "eval_steps",
              f"must all be >= 0, got {self.eval_steps}")
        check(self.workers >= 0, "workers", f"must be >= 0, got {self.workers}")
        check(self.eval_batches is None or self.eval_batches >= 1, "eval_batches",
              f"must be >= 1 or null, got {self.eval_batches}")
        check(self.max_equal_flops_steps >= 1, "max_equal_flops_steps",
              f"must be >= 1, got {self.max_equal_flops_steps}")


@dataclass
class TrainConfig:
    """`train:` section of params.yaml. Defaults: a short run of the tiny model on a CPU."""

    seed: int = 1337
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # cache = the token cache of the tokenize stage; synthetic = uniform random tokens (throughput);
    # auto = the cache in data.cache_dir when there is one, else synthetic (the GPU profile)
    data: Literal["cache", "synthetic", "auto"] = "cache"
    steps: int = 200  # optimiser steps
    batch_size: int | Auto = 16  # sequences per process per micro-step; auto = largest that fits
    seq_len: int = 128
    grad_accum: int = 1  # micro-steps per optimiser step
    lr: float = 3e-3  # peak learning rate, reached after warmup_steps
    min_lr: float = 3e-4  # end of the cosine decay
    warmup_steps: int = 20
    weight_decay: float = 0.1  # on matrices only, not on norms
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # max global gradient norm; 0 = no clipping
    eval_every: int = 50  # steps between validation losses (and at the end)
    eval_batches: int = 8  # validation batches per evaluation
    checkpoint_every: int = 100  # steps between checkpoints (and at the end); 0 = end only
    resume: bool = True  # continue from the checkpoint in out_dir if it matches this config
    log_every: int = 10  # steps between progress updates (each one waits for the device)
    timing_warmup: int = 5  # first steps left out of tokens/s (compilation, allocator warm-up)
    memory_fraction: float = 0.85  # batch_size auto: share of GPU memory a step may use
    # adamw; or muon: torch.optim.Muon on the blocks' 2-D weights, AdamW (lr, betas,
    # weight_decay above) on the embedding / head and the norms (ltm.train.optimizers); same lr schedule
    optimizer: Literal["adamw", "muon"] = "adamw"
    muon_lr: float = 0.02  # Muon's peak lr (its schedule: lr's, scaled by muon_lr / lr)
    muon_momentum: float = 0.95
    muon_weight_decay: float = 0.0
    # original: lr * sqrt(max(1, rows / cols)) (Keller Jordan's); match_rms_adamw: Moonshot's
    # 0.2 * sqrt(max(rows, cols)), which lets muon_lr be an AdamW-sized lr
    muon_adjust_lr: Literal["original", "match_rms_adamw"] = "original"
    # time to target: the first evaluation whose val_loss <= target_loss is recorded (train.json:
    # seconds, tokens, step); null = off
    target_loss: float | None = None
    # latent thoughts (model.n_latent > 0): each batch's posterior and its inner loop
    latent: LatentConfig = field(default_factory=LatentConfig)
    # the train stage's other models beside this one: latent vs plain (ltm.train.counterpart)
    counterpart: CounterpartConfig = field(default_factory=CounterpartConfig)
    opt: OptConfig = field(default_factory=OptConfig)

    def __post_init__(self):
        for name in ("steps", "seq_len", "grad_accum", "eval_every", "eval_batches", "log_every"):
            check(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "checkpoint_every", "timing_warmup"):
            check(getattr(self, name) >= 0, name, f"must be >= 0, got {getattr(self, name)}")
        check(self.batch_size == "auto" or self.batch_size >= 1, "batch_size",
              f"must be >= 1 or auto, got {self.batch_size}")
        check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
        check(0 <= self.min_lr <= self.lr, "min_lr", f"must be in [0, lr={self.lr}], got {self.min_lr}")
        check(self.grad_clip >= 0, "grad_clip", f"must be >= 0, got {self.grad_clip}")
        check(0 < self.memory_fraction <= 1, "memory_fraction",
              f"must be in (0, 1], got {self.memory_fraction}")
        check(self.muon_lr > 0, "muon_lr", f"must be > 0, got {self.muon_lr}")
        check(0 <= self.muon_momentum < 1, "muon_momentum",
              f"must be in [0, 1), got {self.muon_momentum}")
        check(self.muon_weight_decay >= 0, "muon_weight_decay",
              f"must be >= 0, got {self.muon_weight_decay}")


@dataclass
class Switches:
    """OptConfig with every auto decided for the device."""

    amp: Literal["off", "bf16", "fp16"]
    tf32: bool
    compile: bool
    fused_adamw: bool
    workers: int
    pin_memory: bool
    pretokenized: bool
    fused_loss: bool
    compile_mode: str = "default"
    fp8: str = "off"  # off | mlp | blocks | all
    fused_ops: tuple[str, ...] = ()


def resolve_switches(opt: OptConfig, device: torch.device) -> Switches:
    cuda = device.type == "cuda"
    decide = {name: cuda if getattr(opt, name) == "auto" else getattr(opt, name)
              for name in ("tf32", "compile", "fused_adamw", "pin_memory")}
    # measured on an H200 (GPT-2 small, T=1024, compiled): the chunked loss saved 0.8 GB of 9.5
    # but cost 11% of tokens/s, so it is for when memory, not speed, is short
    decide["fused_loss"] = False if opt.fused_loss == "auto" else opt.fused_loss
    amp = ("bf16" if cuda else "off") if opt.amp == "auto" else opt.amp
    # page-locked memory only speeds up copies to a GPU; TF32 is a GPU number format
    decide["pin_memory"] = decide["pin_memory"] and cuda
    decide["tf32"] = decide["tf32"] and cuda
    fp8 = {True: "blocks", False: "off"}.get(opt.fp8, opt.fp8)
    return Switches(amp=amp, fp8=fp8, workers=opt.workers, pretokenized=opt.pretokenized,
                    compile_mode=opt.compile_mode, fused_ops=tuple(opt.fused_ops),
                    **decide)


@dataclass
class TrainResult:
    metrics: dict  # what train.json holds
    history: list[dict]  # rows (step, split, loss) of the loss curves
    checkpoint: Path | None  # the last checkpoint written
    # the train stage with counterparts: every model's rows (model, step, split, loss, seconds)
    compared: list[dict] = field(default_factory=list)


class TrainingDiverged(RuntimeError):
    """The loss, the weights or the optimiser state became NaN or infinite; the run stopped, its
    last checkpoint with finite weights and optimiser state kept."""


def load_configs(params_path: str | Path,
                 overrides: list[str] = ()) -> tuple[ModelConfig, TrainConfig, str]:
    """The model and train sections and data.cache_dir, with `section.key=value` overrides
    (values read as YAML) applied first."""
    params = read_params(params_path)
    for item in overrides:
        apply_override(params, item, "--set")
    model_cfg = from_mapping(ModelConfig, params.get("model"), "model")
    train_cfg = from_mapping(TrainConfig, params.get("train"), "train")
    return model_cfg, train_cfg, cache_dir_of(params)
