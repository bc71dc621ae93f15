"""The optimisers of `train.optimizer` and their schedule: AdamW, or Muon (torch.optim.Muon,
orthogonalised momentum, torch >= 2.9) on the hidden 2-D weights with AdamW on the embedding / tied
head and on every 1-D parameter (norms), as one object (MuonAdamW) that the scheduler, the grad
scaler and the checkpoint see as one optimiser; linear warm-up then cosine decay of the lr.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ltm.params import ParamsError
from ltm.train.settings import TrainConfig


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to lr, then cosine decay to min_lr at the last step; a factor of lr."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return (cfg.min_lr + cosine * (cfg.lr - cfg.min_lr)) / cfg.lr


def make_optimizer(model: nn.Module, cfg: TrainConfig, fused: bool, compiled: bool = False):
    """AdamW (fused: its fused CUDA kernel) or Muon + AdamW (compiled: Muon's step compiled), with
    the lr schedule."""
    if cfg.optimizer == "muon":
        optimizer = make_muon(model, cfg, fused, compiled)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))
        return optimizer, scheduler
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))
    return optimizer, scheduler


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
