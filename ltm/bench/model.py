"""Timings of the model's token mixers and of cached generation, for the benchmark stage.

    rows = bench_mixers(cfg, batch=1, seq_len=1024)            # naive vs chunked, per mixer
    rows = bench_generate(cfg, batch=1, prompt_len=16, new_tokens=256)   # cached vs uncached

Each function returns a list of dict rows (one per measurement) for a pandas DataFrame. A time is
the median of `repeats` runs after `warmup` runs, taken with time.perf_counter around a CUDA
synchronisation when on a GPU.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable

import torch

from ltm.mixers import make_mixer
from ltm.model import LTM, ModelConfig

# the mixers compared by default: name -> model settings
VARIANTS = {
    "attention": dict(mixer="attention", hierarchical=False),
    "rwkv7": dict(mixer="rwkv7", hierarchical=False, window=None),
    "deltanet": dict(mixer="deltanet", hierarchical=False, window=None),
    "deltanet-hier": dict(mixer="deltanet", hierarchical=True, window=None),
}


def median_ms(fn: Callable[[], object], device: torch.device, warmup: int = 1,
              repeats: int = 3) -> float:
    """Median wall time of fn() in milliseconds."""
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _variant(cfg: ModelConfig, name: str, settings: dict, **overrides) -> ModelConfig:
    # attention's window and deltanet's hierarchy only exist for their own mixer
    settings = dict(settings)
    if settings["mixer"] == "attention":
        settings.setdefault("window", cfg.window)
    return dataclasses.replace(cfg, **settings, **overrides)


def bench_mixers(cfg: ModelConfig, batch: int, seq_len: int, variants: dict | None = None,
                 kernels: tuple[str, ...] = ("naive", "torch"), backward: bool = True,
                 warmup: int = 1, repeats: int = 3, device: str | torch.device | None = None,
                 dtype: torch.dtype = torch.float32) -> list[dict]:
    """Forward (and forward + backward) time of one token mixer of cfg's size on (batch, seq_len,
    d_model) inputs, per variant and kernel; attention has a single implementation ("sdpa").
    Rows: mixer, impl, pass, B, T, ms, tokens_per_s, speedup (time of the first kernel / this),
    error (None, or why this implementation could not run here; ms is then nan)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    rows = []
    for name, settings in (variants or VARIANTS).items():
        impls = ("sdpa",) if settings["mixer"] == "attention" else kernels
        for impl in impls:
            kernel = cfg.kernel if impl == "sdpa" else impl
            mixer_cfg = _variant(cfg, name, settings, kernel=kernel,
                                 max_seq_len=max(cfg.max_seq_len, seq_len))
            torch.manual_seed(0)
            mixer = make_mixer(mixer_cfg, layer=0).to(device=device, dtype=dtype)
            x = torch.randn(batch, seq_len, cfg.d_model, device=device, dtype=dtype)
            passes = {"forward": lambda: _forward(mixer, x)}
            if backward:
                x_grad = x.clone().requires_grad_()
                passes["forward+backward"] = lambda: mixer(x_grad)[0].sum().backward()
            for pass_name, fn in passes.items():
                ms, error = _time_or_error(fn, device, warmup, repeats)
                rows.append({"mixer": name, "impl": impl, "pass": pass_name, "B": batch,
                             "T": seq_len, "ms": ms, "tokens_per_s": batch * seq_len / (ms / 1e3),
                             "error": error})
    return _add_speedup(rows, ("mixer", "pass"))


def _time_or_error(fn, device, warmup: int, repeats: int) -> tuple[float, str | None]:
    """(median ms, None), or (nan, the error's first line) where an implementation refuses to run
    here (e.g. an external kernel on an unsupported GPU / Triton pair): one such case must not
    stop the whole benchmark."""
    try:
        return median_ms(fn, device, warmup, repeats), None
    except (RuntimeError, ValueError, NotImplementedError) as err:
        return float("nan"), f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


@torch.no_grad()
def _forward(mixer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return mixer(x)[0]


def bench_generate(cfg: ModelConfig, batch: int, prompt_len: int, new_tokens: int,
                   variants: dict | None = None, warmup: int = 1, repeats: int = 3,
                   device: str | torch.device | None = None,
                   dtype: torch.dtype = torch.float32) -> list[dict]:
    """Time of generating new_tokens greedy tokens after a random prompt, with the cache
    (`LTM.generate`) and by recomputing the whole sequence per token (`LTM.generate_uncached`),
    per variant. Rows: mixer, impl, B, prompt, new_tokens, ms, tokens_per_s, speedup
    (uncached time / this), same (both produced the same tokens)."""
    if cfg.vocab_size <= 0:
        raise ValueError("cfg.vocab_size: must be > 0 to build a model")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    rows = []
    prompt = torch.randint(0, cfg.vocab_size, (batch, prompt_len), device=device,
                           generator=torch.Generator(device).manual_seed(0))
    for name, settings in (variants or VARIANTS).items():
        model_cfg = _variant(cfg, name, settings, n_latent=0,
                             max_seq_len=max(cfg.max_seq_len, prompt_len + new_tokens))
        torch.manual_seed(0)
        model = LTM(model_cfg).to(device=device, dtype=dtype).eval()
        outputs = {}
        for impl, generate in (("uncached", model.generate_uncached), ("cached", model.generate)):
            def run(generate=generate, impl=impl):
                outputs[impl] = generate(prompt, max_new_tokens=new_tokens, temperature=0)
            ms = median_ms(run, device, warmup, repeats)
            rows.append(dict(mixer=name, impl=impl, B=batch, prompt=prompt_len,
                             new_tokens=new_tokens, ms=ms,
                             tokens_per_s=batch * new_tokens / (ms / 1e3)))
        same = torch.equal(outputs["cached"], outputs["uncached"])
        rows[-1]["same"] = rows[-2]["same"] = same
    return _add_speedup(rows, ("mixer",))


def _add_speedup(rows: list[dict], group_keys: tuple[str, ...]) -> list[dict]:
    """speedup = ms of the first row of the same group (same mixer, pass) / ms of this row."""
    first: dict[tuple, float] = {}
    for row in rows:
        key = tuple(row[k] for k in group_keys)
        first.setdefault(key, row["ms"])
        row["speedup"] = first[key] / row["ms"]
    return rows
