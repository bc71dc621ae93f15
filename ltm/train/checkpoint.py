"""Training checkpoints: atomic writes, random-number states, and the rule for resuming.

A checkpoint is one file written to a temporary name beside its destination and moved over it with
os.replace, so a run killed at any instant leaves either the previous checkpoint or the new one,
never half of one. It holds everything the next step depends on: weights, optimiser, scheduler and
grad-scaler states, every random-number state of every process, the data position and the loss
history so far. The temp file of a writer killed mid-write is removed on the next start
(remove_stale_temps); a checkpoint is resumed only by the same code, configs and token cache
(resume_mismatch).
"""
from __future__ import annotations

import functools
import hashlib
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ltm.latent.encoder import attach_encoder
from ltm.latent.posterior import LatentConfig
from ltm.model.config import ModelConfig
from ltm.model.decoding import GenerationError
from ltm.model.lm import LTM
from ltm.params import from_mapping

CHECKPOINT_FILE = "last.pt"
# keys of the train section that may differ between a run and its resumption
RESUMABLE_CHANGES = ("steps", "resume")
# the token cache last verified in full (ltm.data.cache.verify_cache), kept with the checkpoint: run
# state, not the cache's (a DVC output that a file of ours would change)
STAMP_FILE = ".cache_verified.json"
# save_checkpoint's temp file: .<name>.<pid of the writer>.tmp
TEMP_NAME = re.compile(r"\.(.+)\.([0-9]+)\.tmp")


def save_checkpoint(path: str | Path, state: dict) -> None:
    """Write `state` to `path` atomically: a temp file in the same folder, synced, then renamed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_stale_temps(folder: str | Path) -> list[Path]:
    """Delete the temp files that writers killed mid-write (kill -9 gives them no chance to clean
    up) left in `folder`: those whose writer process is gone, or is this process, which is not
    writing when it calls this. Returns the files removed."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for path in sorted(folder.iterdir()):
        match = TEMP_NAME.fullmatch(path.name)
        if match and path.is_file() and not _alive(int(match.group(2))):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def all_finite(*trees: Any) -> bool:
    """Whether every floating-point tensor in the nested dicts / lists `trees` (state dicts of a
    model and an optimiser) is finite: one reduction per device, one wait for each. (An AdamW
    keeps its `step` counters on the CPU while the weights are on the GPU.)"""
    flags: dict[torch.device, list[torch.Tensor]] = {}
    for t in _tensors(trees):
        if t.is_floating_point():
            flags.setdefault(t.device, []).append(torch.isfinite(t).all())
    return all(bool(torch.stack(group).all()) for group in flags.values())


def _tensors(tree: Any):
    if torch.is_tensor(tree):
        yield tree
    elif isinstance(tree, dict):
        for value in tree.values():
            yield from _tensors(value)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            yield from _tensors(value)


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


def resume_mismatch(checkpoint: dict, model_cfg: dict, train_cfg: dict, world_size: int,
                    data: str) -> str | None:
    """Why the run described by the arguments cannot continue `checkpoint`, or None if it can.
    The code, the data (`data`: the fingerprint of the token cache, see ltm.data.cache) and everything
    in the configs must match, except the keys in RESUMABLE_CHANGES."""
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
    # e.g. data.val_fraction changed: the cache was rebuilt, the model and train sections were not
    if checkpoint.get("data") != data:
        return "the token cache has changed since it was written"
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


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_model(checkpoint: str | Path, device: str | torch.device = "cpu",
               dtype: torch.dtype | None = None) -> LTM:
    """The model of a train-stage checkpoint (its folder or file); its config is inside, and
    so is the encoder of q's start where the run had one (train.latent.init encoder)."""
    path = Path(checkpoint)
    if path.is_dir():
        path = path / CHECKPOINT_FILE
    saved = load_checkpoint(path)
    if saved is None:
        raise GenerationError(f"{path}: no checkpoint there (train one first: dvc repro train)")
    if not isinstance(saved, dict) or "model" not in saved or "model_cfg" not in saved:
        raise GenerationError(f"{path}: not a checkpoint of ltm.stages.train (no model or model_cfg)")
    model = LTM(from_mapping(ModelConfig, saved["model_cfg"], f"{path}: model_cfg"))
    # the encoder of q's start, if the run trained one (train.latent.init encoder)
    latent = (saved.get("train_cfg") or {}).get("latent")
    attach_encoder(model, from_mapping(LatentConfig, latent, f"{path}: train_cfg.latent"))
    model.load_state_dict(saved["model"])
    return model.to(device=device, dtype=dtype).eval()


def load_latent_config(checkpoint: str | Path) -> LatentConfig:
    """train.latent of the run that wrote the checkpoint (folder or file): the inner loop its
    decoder was trained with, which fitting z to a prompt should repeat. Defaults where the
    checkpoint holds none (a plain run of an older version)."""
    path = Path(checkpoint)
    saved = load_checkpoint(path / CHECKPOINT_FILE if path.is_dir() else path)
    latent = ((saved or {}).get("train_cfg") or {}).get("latent") if isinstance(saved, dict) else None
    return from_mapping(LatentConfig, latent, f"{path}: train_cfg.latent")
