"""Timings of the model's token mixers and of generation, for the benchmark stage and gpu/.

    rows = bench_mixers(cfg, batch=1, seq_len=1024)            # naive vs chunked, per mixer
    rows = bench_generate(cfg, batch=1, prompt_len=16, new_tokens=256)   # generation paths
    rows = bench_generate_memory(cfg, contexts=(1024, 32768))  # generation state vs context
    rows = bench_quantization(cfg, modes=("int8",), batches=...)   # loss cost of quantising

Each function returns a list of dict rows (one per measurement) for a pandas DataFrame. A time is
the median of `repeats` runs after `warmup` runs, taken with time.perf_counter around a CUDA
synchronisation when on a GPU.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Callable

import torch

from ltm.bench.timing import device_sync, host_ms
from ltm.model.decoding import Decoder, Sampling
from ltm.generate import quantization_loss_delta, quantize_model
from ltm.model.lm import LTM, ModelConfig, build_mixer

# the mixers compared by default: name -> model settings
VARIANTS = {
    "attention": dict(mixer="attention", hierarchical=False),
    "rwkv7": dict(mixer="rwkv7", hierarchical=False, window=None),
    "deltanet": dict(mixer="deltanet", hierarchical=False, window=None),
    "deltanet-hier": dict(mixer="deltanet", hierarchical=True, window=None),
    # the memory (ltm/ops/titans) beside sliding-window attention, model.titans_* as configured
    "titans": dict(mixer="titans", hierarchical=False, window=None),
}


def median_ms(fn: Callable[[], object], device: torch.device, warmup: int = 1,
              repeats: int = 3) -> float:
    """Median wall time of fn() in milliseconds (`ltm.bench.timing.host_ms`)."""
    return host_ms(fn, repeats, warmup=warmup, sync=device_sync(device))


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
            mixer = build_mixer(mixer_cfg, layer=0).to(device=device, dtype=dtype)
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


# generation paths: the two references of LTM, then ltm.generate's Decoder (static buffers, CUDA
# graph on a GPU) by weight quantisation and torch.compile
DECODER_IMPLS = {"static": ("none", False), "compiled": ("none", True), "int8": ("int8", False),
                 "int8-compiled": ("int8", True), "int4": ("int4", False),
                 "int4-compiled": ("int4", True)}
GENERATE_IMPLS = ("uncached", "cached", *DECODER_IMPLS)


def _decoder(model: LTM, impl: str, batch: int, length: int) -> Decoder:
    quantize, compile = DECODER_IMPLS[impl]
    if quantize != "none":
        model = quantize_model(copy.deepcopy(model), quantize)
    return Decoder(model, batch, length, Sampling(temperature=0), compile=compile)


def _generate_fns(model: LTM, impl: str, prompt: torch.Tensor, new_tokens: int):
    """(generate, prefill or None) for one implementation: each returns new tokens / logits."""
    T = prompt.shape[1]
    if impl == "uncached":
        return lambda: model.generate_uncached(prompt, max_new_tokens=new_tokens,
                                               temperature=0)[:, T:], None
    if impl == "cached":
        return (lambda: model.generate(prompt, max_new_tokens=new_tokens, temperature=0)[:, T:],
                lambda: model.forward_cached(prompt, model.new_cache(len(prompt)), last_only=True))
    decoder = _decoder(model, impl, len(prompt), T + new_tokens - 1)
    rows = list(prompt)
    return lambda: decoder.generate(rows, new_tokens), lambda: decoder.prefill(rows)


def bench_generate(cfg: ModelConfig, batch: int, prompt_len: int, new_tokens: int,
                   variants: dict | None = None, impls: tuple[str, ...] = ("uncached", "cached",
                                                                          "static"),
                   warmup: int = 1, repeats: int = 3, device: str | torch.device | None = None,
                   dtype: torch.dtype = torch.float32) -> list[dict]:
    """Greedy generation of new_tokens tokens after a random prompt, per variant and
    implementation (GENERATE_IMPLS). Rows: mixer, impl, B, prompt, new_tokens, ms (the whole
    generation), prefill_ms, ms_per_token (after the prefill), tokens_per_s (B * new_tokens / ms),
    speedup (the first impl's ms / this), same (the tokens of LTM.generate, or None without
    "cached"), error (None, or why the implementation could not run; ms is then nan)."""
    if cfg.vocab_size <= 0:
        raise ValueError("cfg.vocab_size: must be > 0 to build a model")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    prompt = torch.randint(0, cfg.vocab_size, (batch, prompt_len), device=device,
                           generator=torch.Generator(device).manual_seed(0))
    rows = []
    for name, settings in (variants or VARIANTS).items():
        model_cfg = _variant(cfg, name, settings, n_latent=0,
                             max_seq_len=max(cfg.max_seq_len, prompt_len + new_tokens))
        torch.manual_seed(0)
        model = LTM(model_cfg).to(device=device, dtype=dtype).eval()
        outputs, first = {}, len(rows)
        for impl in impls:
            row = dict(mixer=name, impl=impl, B=batch, prompt=prompt_len, new_tokens=new_tokens,
                       ms=float("nan"), prefill_ms=float("nan"), error=None)
            try:
                generate, prefill = _generate_fns(model, impl, prompt, new_tokens)

                def run(generate=generate, impl=impl):
                    outputs[impl] = generate()
                row["ms"] = median_ms(run, device, warmup, repeats)
                if prefill is not None:
                    row["prefill_ms"] = median_ms(prefill, device, warmup, repeats)
            # one path failing here (a compiler, torchao) must not stop the others
            except Exception as err:
                row["error"] = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"
            row["ms_per_token"] = (row["ms"] - row["prefill_ms"]) / max(new_tokens - 1, 1)
            row["tokens_per_s"] = batch * new_tokens / (row["ms"] / 1e3)
            rows.append(row)
        for row in rows[first:]:
            ok = "cached" in outputs and row["impl"] in outputs
            row["same"] = torch.equal(outputs[row["impl"]], outputs["cached"]) if ok else None
    return _add_speedup(rows, ("mixer",))


def bench_generate_memory(cfg: ModelConfig, contexts: tuple[int, ...], batch: int = 1,
                          variants: dict | None = None, steps: int = 4,
                          device: str | torch.device | None = None,
                          dtype: torch.dtype = torch.float32) -> list[dict]:
    """The static generation state against context length: attention's KV cache grows with it,
    the recurrent states do not. Rows: mixer, impl ("static"), B, context, cache_mib (the state's
    buffers), ms = ms_per_token (one step over a cache of that length, median of `steps`), peak_mib
    (CUDA: peak allocated memory of the prefill and steps, weights included; nan on a CPU)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    rows = []
    for name, settings in (variants or VARIANTS).items():
        # one model per mixer: the decoder's cache, not the model, has the context's length
        torch.manual_seed(0)
        model = LTM(_variant(cfg, name, settings, n_latent=0, max_seq_len=max(contexts)))
        model = model.to(device=device, dtype=dtype).eval()
        for context in contexts:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            decoder = Decoder(model, batch, context, Sampling(temperature=0))
            decoder.prefill([torch.zeros(1, dtype=torch.long, device=device)] * batch)
            # the step attends over the whole static cache, so its cost does not depend on the
            # position reached
            ms = median_ms(decoder.step, device, warmup=1, repeats=steps)
            peak = (torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda"
                    else float("nan"))
            # no slow original to be faster than: speedup stays nan (left out of the figures)
            rows.append(dict(mixer=name, impl="static", B=batch, context=context, ms=ms,
                             cache_mib=decoder.cache_bytes() / 2**20, ms_per_token=ms,
                             peak_mib=peak, speedup=float("nan")))
            del decoder
    return rows


def bench_quantization(cfg: ModelConfig, modes: tuple[str, ...], batches: list,
                       variants: dict | None = None, device: str | torch.device | None = None,
                       dtype: torch.dtype = torch.float32) -> list[dict]:
    """What weight-only quantisation costs in loss, per variant and mode, on (x, y) batches (the
    token cache's validation split, `ltm.generate.val_batches`, for a trained model). Rows:
    mixer, impl (the mode), loss, quantized_loss, loss_delta, error."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    rows = []
    for name, settings in (variants or VARIANTS).items():
        torch.manual_seed(0)
        model = LTM(_variant(cfg, name, settings, n_latent=0)).to(device=device, dtype=dtype)
        for mode in modes:
            row = dict(mixer=name, impl=mode, error=None)
            try:
                row.update(quantization_loss_delta(model, mode, batches))
            except Exception as err:  # e.g. int4 off CUDA, torchao missing
                row["error"] = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"
            rows.append(row)
    return rows


def _add_speedup(rows: list[dict], group_keys: tuple[str, ...]) -> list[dict]:
    """speedup = ms of the first row of the same group (same mixer, pass) / ms of this row."""
    first: dict[tuple, float] = {}
    for row in rows:
        key = tuple(row[k] for k in group_keys)
        first.setdefault(key, row["ms"])
        row["speedup"] = first[key] / row["ms"]
    return rows
