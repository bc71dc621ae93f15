"""Launch choices per shape class: `triton.autotune` over a short list of configurations per
kernel, one tuner per (kernel, shape class), so that a shape is timed once per class and dtype.

A configuration is (meta-parameters, e.g. the value block BV; num_warps; num_stages). The
launchers (`ltm.kernels.delta_rule.chunk`, `ltm.kernels.rwkv7.chunk`) give each kernel its list,
measured default first, and the shape class it launches for. Three modes:
- with `AUTOTUNE` (the environment's LTM_AUTOTUNE=1, on a GPU): the first launch of a class
  times every configuration of the list (short `do_bench` runs; configurations that do not
  compile or fit, e.g. out of shared memory, are skipped by Triton) and keeps the fastest for the
  rest of the process. Off by default: on an H100 (gpu/kernel_grid.py, 2026-11-23) the tuned
  forward was 0.82x the defaults' (geometric mean over 4 shapes, 0.65x at worst; each kernel is
  timed alone, in 30 ms runs) and the forward+backward 1.05x (0.94x at worst);
- without it (the default; always in Triton's interpreter, where timings mean nothing and every
  configuration would run through the CPU tests; a probe that only compiles): the default, the
  list's first, or the configuration a class already tuned;
- while torch.compile traces a model: never a new tuning run (Dynamo records the launch into its
  graph without running it, so no configuration could be timed); the class's tuned
  configuration if it has one, else the default;
- `FORCED[name]`: that configuration, whatever the mode (tests of a launch path, sweeps).
`chosen()` tells which configuration each tuned class took (gpu/kernel_grid.py records it).
"""
from __future__ import annotations

import functools
import os
from typing import Callable

import torch
import triton

# tune when asked (see the module docstring); Triton's interpreter runs the default only
AUTOTUNE = os.environ.get("LTM_AUTOTUNE") == "1" and os.environ.get("TRITON_INTERPRET") != "1"
# kernel name -> {"BV": .., "num_warps": .., "num_stages": ..}: launched as given, never tuned
FORCED: dict[str, dict] = {}
# timing of one configuration while tuning: short, since a class tunes 3-6 configurations of
# each of 5-6 kernels on its first call (Triton's default, 25 + 100 ms, would take ~15 s)
TUNE_WARMUP_MS, TUNE_REP_MS = 5, 25

_TUNERS: dict[tuple, object] = {}
# (kernel name, shape class) -> the configuration its tuning chose, what later launches take
_TUNED: dict[tuple, dict] = {}


def config(num_warps: int, num_stages: int, **meta) -> triton.Config:
    return triton.Config(dict(meta), num_warps=num_warps, num_stages=num_stages)


def per_class(configs_of: Callable[..., list]) -> Callable[..., tuple]:
    """A launcher's configuration list, built once per shape class (its arguments) and kept as a
    tuple: the lists were rebuilt at every launch, 24 `triton.Config`s per delta-rule forward,
    about a fifth of its Python outside Triton's launches (this CPU, launches stubbed out,
    2026-11-26). Only for lists that depend on their arguments alone (not on a module switch a
    test may patch). While torch.compile traces, the list is built afresh: Dynamo ignores an
    lru_cache and warns that it does (once per compiled model, on the user's screen)."""
    cached = functools.lru_cache(maxsize=None)(lambda *key: tuple(configs_of(*key)))

    @functools.wraps(configs_of)
    def configs(*key):
        if torch.compiler.is_compiling():
            return tuple(configs_of(*key))
        return cached(*key)
    return configs


def _as_kwargs(cfg: triton.Config) -> dict:
    return {**cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}


def _bench(fn, quantiles=None):
    return triton.testing.do_bench(fn, warmup=TUNE_WARMUP_MS, rep=TUNE_REP_MS, quantiles=quantiles)


def launch(name: str, kernel, grid: Callable[[dict], tuple], configs: list[triton.Config],
           shape_class: tuple, kwargs: dict, restore: tuple[str, ...] = ()) -> dict:
    """Launch `kernel(**kwargs)` over `grid(meta)` with the configuration of `configs` chosen for
    `shape_class` (see the module docstring); returns that configuration's kwargs.

    `restore` names the buffers the kernel updates in place: tuning runs it several times, so
    Triton saves them first and puts them back after each timed run."""
    if name in FORCED:
        chosen = dict(FORCED[name])
        kernel[grid(chosen)](**kwargs, **chosen)
        return chosen
    tuned = _TUNED.get((name, shape_class))
    if not AUTOTUNE or len(configs) == 1 or torch.compiler.is_compiling() or tuned is not None:
        # the class's tuned choice, else the default: plain dicts and tuples only, since dynamo
        # may be tracing (str() of the configurations, the tuners' key below, could stop it).
        # A tuned class is launched here too, not through its tuner: triton.autotune's per-call
        # Python made the tuned forward 0.62x the default's at 1,16384,8,64 and 0.79x at
        # 8,2048,16,64 where the kernels take ~0.1 ms each (H100, Triton 3.6, 2026-11-25)
        chosen = tuned or _as_kwargs(configs[0])
        kernel[grid(chosen)](**kwargs, **chosen)
        return chosen
    key = (name, shape_class, tuple(str(c) for c in configs))
    tuner = _TUNERS.get(key)
    if tuner is None:
        # `_bench` looked up at each call, so that a test can time on the host instead
        tuner = triton.autotune(configs=list(configs), key=[], restore_value=list(restore),
                                do_bench=lambda fn, quantiles=None: _bench(fn, quantiles))(kernel)
        _TUNERS[key] = tuner
    tuner[grid](**kwargs)
    _TUNED[(name, shape_class)] = _as_kwargs(tuner.best_config)
    return _TUNED[(name, shape_class)]


def chosen() -> list[dict]:
    """The configuration each (kernel, shape class) tuned so far took, with its timings (ms)."""
    rows = []
    for (name, shape_class, _), tuner in _TUNERS.items():
        best = getattr(tuner, "best_config", None)
        timings = getattr(tuner, "configs_timings", None) or {}
        rows.append({"kernel": name, "class": list(shape_class),
                     "best": None if best is None else _as_kwargs(best),
                     "timings": [{**_as_kwargs(c), "ms": t[0] if isinstance(t, (list, tuple)) else t}
                                 for c, t in timings.items()]})
    return rows


def bucket(n: int, cap: int) -> int:
    """n rounded up to a power of two, at most `cap`: the shape classes' sizes."""
    return min(cap, 1 << max(0, (int(n) - 1).bit_length()))
