"""`train.opt.fp8`: torchao's float8 training for the MLPs, every block linear, or those and the
head (Hopper / Ada: SM 8.9+). torchao is imported only when a run asks for float8: it is an
optional dependency with compiled extensions.
"""
from __future__ import annotations

import importlib.util

import torch
from torch import nn

from ltm.params import ParamsError
from ltm.train.settings import FP8_CHOICES


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
