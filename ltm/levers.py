"""The train stage's newer speed levers, each a switch of `train` or `train.opt` (ltm.train_config):

- `train.optimizer: muon`: torch.optim.Muon (orthogonalised momentum, torch >= 2.9) on the hidden
  2-D weights, AdamW on the embedding / tied head and on every 1-D parameter (norms), one object
  (MuonAdamW) that the scheduler, the grad scaler and the checkpoint see as one optimiser;
- `train.opt.fp8`: torchao's float8 training for the MLPs, every block linear, or those and the
  head (Hopper / Ada: SM 8.9+);
- `train.opt.fused_ops`: fused Triton kernels for RMSNorm, SwiGLU (ours), RoPE and the linear
  cross-entropy (Liger-Kernel's), swapped in module by module (ltm.fused);
- `train.target_loss`: time to target, the training seconds and tokens to a validation loss;
- `train.data: auto`: the token cache when there is one, random tokens otherwise.

Each lever is off by default; ltm.ablate.REGISTRY says which of them keep the maths (exact) and which
change it (approximate).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch import nn

from ltm.params import ParamsError

OPTIMIZERS = ("adamw", "muon")
# train.opt.fused_ops (ltm.fused; named here so that checking params imports no Triton)
FUSED_OPS = ("rms_norm", "swiglu", "rope", "cross_entropy")


def muon_split(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter], list[nn.Parameter]]:
    """(Muon's, AdamW's decayed, AdamW's undecayed) trainable parameters: Muon takes the 2-D
    weights of the blocks; the token embedding (also the tied head: its rows are looked up one
    token at a time, not a dense map Muon's orthogonalisation fits) goes to AdamW with weight decay;
    1-D parameters (norm gains) to AdamW without."""
    table = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    head = getattr(model, "lm_head", None)
    if head is not None:
        table.add(id(head.weight))
    muon, decayed, plain = [], [], []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        if p.dim() < 2:
            plain.append(p)
        elif id(p) in table or p.dim() != 2:
            decayed.append(p)
        else:
            muon.append(p)
    return muon, decayed, plain


class MuonAdamW(torch.optim.Optimizer):
    """Muon on some parameters and AdamW on the rest, stepped together. param_groups are the two
    optimisers' own group dicts (Muon's first), so an lr scheduler scales both from their own
    initial lr and a grad scaler unscales every gradient. The state dict holds both parts:
    {"state": {"muon": ..., "adamw": ...}, "param_groups": {"muon": [...], "adamw": [...]}}."""

    def __init__(self, muon: torch.optim.Optimizer, adamw: torch.optim.Optimizer,
                 compiled: bool = False) -> None:
        self.parts = {"muon": muon, "adamw": adamw}
        # the same dicts as the parts' (add_param_group keeps the dict it is given)
        super().__init__(muon.param_groups + adamw.param_groups, {})
        # compiled: Muon's per-matrix loop of Newton-Schulz matmuls as one graph, its lr a tensor
        # (see tensor_lrs). Measured on an H100 (LOG.md, tenth session) it left Muon's cost as it
        # was (0.78x AdamW's step at 124M, eager 0.79x): the matmuls cost, not the launches
        self.compiled = compiled
        self._muon_step = torch.compile(muon.step) if compiled else muon.step
        if compiled:
            tensor_lrs(muon)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        self._muon_step()
        self.parts["adamw"].step()
        return loss

    def state_dict(self) -> dict:
        saved = {name: part.state_dict() for name, part in self.parts.items()}
        return {"state": {n: s["state"] for n, s in saved.items()},
                "param_groups": {n: s["param_groups"] for n, s in saved.items()}}

    def load_state_dict(self, state_dict: dict) -> None:
        if set(state_dict.get("state", {})) != set(self.parts):
            raise ValueError("optimizer state: not a Muon + AdamW state (train.optimizer changed?)")
        for name, part in self.parts.items():
            part.load_state_dict({"state": state_dict["state"][name],
                                  "param_groups": state_dict["param_groups"][name]})
        if self.compiled:  # a checkpoint of an eager run brings float lrs back
            tensor_lrs(self.parts["muon"])


def tensor_lrs(optimizer: torch.optim.Optimizer) -> None:
    """Each group's lr (and initial_lr) as a 0-d tensor: the lr scheduler then fills it in place,
    and a compiled step reads it as an input. A float lr is a constant of the compiled graph, so
    every new value recompiles it until dynamo's limit, after which the step silently runs eager."""
    for group in optimizer.param_groups:
        for key in ("lr", "initial_lr"):
            if key in group and not isinstance(group[key], torch.Tensor):
                group[key] = torch.tensor(float(group[key]))


def optimizer_parts(optimizer: torch.optim.Optimizer) -> list[torch.optim.Optimizer]:
    """The plain optimisers inside `optimizer` (itself, unless it is a MuonAdamW)."""
    return list(optimizer.parts.values()) if isinstance(optimizer, MuonAdamW) else [optimizer]


def make_muon(model: nn.Module, cfg, fused: bool, compiled: bool = False) -> MuonAdamW:
    """train.optimizer muon: see muon_split. cfg: the TrainConfig (muon_lr, muon_momentum,
    muon_weight_decay, muon_adjust_lr; lr, betas and weight_decay for the AdamW part). compiled:
    Muon's step through torch.compile (train.opt.compile)."""
    if not hasattr(torch.optim, "Muon"):
        raise ParamsError(f"train.optimizer: muon needs torch >= 2.9 (torch.optim.Muon), this is "
                          f"torch {torch.__version__}")
    muon_params, decayed, plain = muon_split(model)
    if not muon_params:
        raise ParamsError("train.optimizer: muon found no 2-D weight outside the embedding")
    adjust = None if cfg.muon_adjust_lr == "original" else cfg.muon_adjust_lr
    muon = torch.optim.Muon(muon_params, lr=cfg.muon_lr, momentum=cfg.muon_momentum,
                            weight_decay=cfg.muon_weight_decay, nesterov=True, adjust_lr_fn=adjust)
    groups = [{"params": decayed, "weight_decay": cfg.weight_decay},
              {"params": plain, "weight_decay": 0.0}]
    adamw = torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr,
                              betas=(cfg.beta1, cfg.beta2), fused=fused)
    return MuonAdamW(muon, adamw, compiled)


# --- time to target and the data of the GPU profile -----------------------------------------

def resolve_data(data: str, cache_dir: str, say=print) -> str:
    """train.data auto: cache when cache_dir holds a token cache (its meta.json), else synthetic."""
    if data != "auto":
        return data
    found = (Path(cache_dir) / "meta.json").is_file()
    say(f"train.data auto: the token cache in {cache_dir}" if found else
        f"train.data auto: no token cache in {cache_dir}: random tokens (throughput only)")
    return "cache" if found else "synthetic"


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


# --- float8 training (torchao) -----------------------------------------------------------

# train.opt.fp8's groups of linears, each a superset of the one before
FP8_CHOICES = ("mlp", "blocks", "all")


def fp8_filter(module: nn.Module, fqn: str, which: str = "blocks") -> bool:
    """Whether float8 training converts this module: an nn.Linear of the group `which` (mlp: the
    blocks' MLPs; blocks: every block linear; all: those and the head, whose weight is the
    embedding's and stays shared) whose both sizes are multiples of 16 (the float8 matmul's
    alignment)."""
    if which not in FP8_CHOICES:
        raise ValueError(f"fp8 group {which!r}; expected one of {FP8_CHOICES}")
    if not isinstance(module, nn.Linear):
        return False
    parts = fqn.split(".")
    head = parts[-1] == "lm_head"
    picked = {"mlp": "mlp" in parts[:-1], "blocks": not head, "all": True}[which]
    return picked and module.in_features % 16 == 0 and module.out_features % 16 == 0


def fp8_ready(device: torch.device) -> str | None:
    """Why float8 training cannot run on `device` (None: it can)."""
    if device.type != "cuda":
        return f"needs a CUDA GPU of compute capability 8.9+ (Ada, Hopper), this is {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return f"needs compute capability 8.9+ (Ada, Hopper), this GPU is {major}.{minor}"
    if importlib.util.find_spec("torchao") is None:
        return "needs torchao (pip install torchao, see requirements.txt)"
    return None


def convert_fp8(model: nn.Module, device: torch.device, which: str = "blocks",
                check_device: bool = True) -> list[str]:
    """Swap the linears fp8_filter picks for group `which` for torchao's Float8Linear (dynamic
    tensorwise scaling; the weights stay float32 and keep their names, so checkpoints are
    unchanged). Returns the converted modules' names. check_device=False converts anywhere (tests
    of the swap itself)."""
    why = fp8_ready(device) if check_device else None
    if why is not None:
        raise ParamsError(f"train.opt.fp8: {why}")
    from torchao.float8 import convert_to_float8_training

    def picks(module: nn.Module, fqn: str) -> bool:
        return fp8_filter(module, fqn, which)
    names = [name for name, m in model.named_modules() if picks(m, name)]
    convert_to_float8_training(model, module_filter_fn=picks)
    return names
