"""Training checkpoints: atomic writes, random-number states, and the rule for resuming.

A checkpoint is one file written to a temporary name beside its destination and moved over it with
os.replace, so a run killed at any instant leaves either the previous checkpoint or the new one,
never half of one. It holds everything the next step depends on: weights, optimiser, scheduler and
grad-scaler states, every random-number state of every process, the data position and the loss
history so far.
"""
from __future__ import annotations

import functools
import hashlib
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

CHECKPOINT_FILE = "last.pt"
# keys of the train section that may differ between a run and its resumption
RESUMABLE_CHANGES = ("steps", "resume")


def save_checkpoint(path: str | Path, state: dict) -> None:
    """Write `state` to `path` atomically: a temp file in the same folder, synced, then renamed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: str | Path) -> dict | None:
    """The checkpoint at `path`, or None if there is none."""
    path = Path(path)
    if not path.is_file():
        return None
    # our own file, holding numpy and python RNG states besides tensors
    return torch.load(path, map_location="cpu", weights_only=False)


@functools.cache
def code_fingerprint() -> str:
    """sha256 of the package's Python sources (ltm/ and the kernels/ folder beside it). A
    checkpoint written by other code is not resumed: DVC re-runs the train stage after an edit to
    the model, and continuing the old run would report the old code's results."""
    package = Path(__file__).resolve().parent
    roots = [package, package.parent / "kernels"]
    files = sorted({f.resolve() for root in roots if root.is_dir() for f in root.rglob("*.py")})
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()


def resume_mismatch(checkpoint: dict, model_cfg: dict, train_cfg: dict, world_size: int) -> str | None:
    """Why the run described by the arguments cannot continue `checkpoint`, or None if it can.
    The code and everything in the configs must match, except the keys in RESUMABLE_CHANGES."""
    if checkpoint.get("code") != code_fingerprint():
        return "the ltm code has changed since it was written"
    if checkpoint.get("world_size") != world_size:
        return f"it was written by {checkpoint.get('world_size')} processes, this run has {world_size}"
    for section, now, then in (("model", model_cfg, checkpoint.get("model_cfg", {})),
                               ("train", train_cfg, checkpoint.get("train_cfg", {}))):
        skip = RESUMABLE_CHANGES if section == "train" else ()
        for key, value_now, value_then in _differences(now, then, section):
            if key.split(".", 1)[1] not in skip:
                return f"{key} was {value_then!r}, now {value_now!r}"
    return None


def _differences(now: Any, then: Any, prefix: str):
    """(dotted key, value now, value then) for each leaf that differs between two nested dicts."""
    if isinstance(now, dict) and isinstance(then, dict):
        for key in sorted(set(now) | set(then)):
            yield from _differences(now.get(key), then.get(key), f"{prefix}.{key}")
    elif now != then:
        yield prefix, now, then


def rng_state() -> dict:
    """This process's random-number states."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def all_rng_states() -> list[dict]:
    """The RNG states of every process, in rank order (collective: every rank must call it)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [rng_state()]
    states: list = [None] * dist.get_world_size()
    dist.all_gather_object(states, rng_state())
    return states
