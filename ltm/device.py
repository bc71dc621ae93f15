"""The `device` setting of a params section (train, study, recall, benchmark), resolved once for
all of them: auto = CUDA when there is one; asking for CUDA on a machine without it is a one-line
error that names the setting, not a traceback from the first tensor moved there."""
from __future__ import annotations

import torch

from ltm.params import ParamsError


def resolve_device(name: str, where: str) -> torch.device:
    """torch.device for a `device` value (auto | cpu | cuda, or cuda:N); `where` names the setting
    in the error ("study.device")."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ParamsError(f"{where}: {name} asked for, but torch sees no CUDA device")
    return torch.device(name)


def device_name(device: torch.device) -> str:
    """What a record calls the device it ran on: the GPU's name, or "cpu"."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
