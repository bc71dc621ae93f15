"""One timing helper for every benchmark of the workbook: the GPU's time through
`triton.testing.do_bench` (plain, or replayed from a CUDA graph), between CUDA events, and the
host's clock around each call. Every function returns milliseconds.

    gpu_ms(step, warmup_ms=10, rep_ms=60, grad_to_none=grads)   # do_bench's median
    graph_ms(step, rep_ms=60)              # the same calls replayed from a CUDA graph: no host work
    event_ms(step, repeats=20)             # the median between two CUDA events per call
    host_ms(step, repeats=3, sync=device_sync(device))   # a host clock around each call
    per_call_ms(step, calls=50, sync=...)  # calls back to back, as a training loop issues steps
    first_call_s(step, sync=...)           # the untimed first call's seconds (compilation, tuning)

Which one a benchmark takes is part of what its records mean, so each keeps the choice it was
recorded with: do_bench's `return_mode` defaults to "median" here, and a caller that was recorded
with do_bench's own default passes "mean". Triton is imported only by the GPU paths: the host
clock serves machines without it. The clock is injectable (`clock`, seconds), so that what a
function does with its readings can be tested without timing anything.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

Clock = Callable[[], float]
RETURN_MODES = ("median", "mean", "min", "max")


def no_sync() -> None:
    """Nothing to wait for (the CPU runs each call to its end)."""


def device_sync(device: torch.device | str) -> Callable[[], None]:
    """A call that waits for the work queued on `device` (nothing on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return no_sync


def _at_least(name: str, value: float, minimum: float) -> None:
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _needs_cuda(what: str) -> None:
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what}: needs a CUDA device (it times GPU work); on the CPU use "
                           "host_ms")


def _return_mode(return_mode: str) -> None:
    if return_mode not in RETURN_MODES:
        raise ValueError(f"return_mode must be one of {RETURN_MODES}, got {return_mode!r}")


def gpu_ms(fn: Callable[[], object], *, warmup_ms: float = 25, rep_ms: float = 100,
           grad_to_none: list[torch.Tensor] | None = None, return_mode: str = "median") -> float:
    """`triton.testing.do_bench`: fn() run for about `warmup_ms`, then timed for about `rep_ms`,
    the L2 cache flushed before each call and the gradients of `grad_to_none` reset; the median
    (or `return_mode`) ms per call. The host launches each call while the GPU runs: where the
    host is slower, its time shows."""
    _at_least("warmup_ms", warmup_ms, 0)
    _at_least("rep_ms", rep_ms, 1)
    _return_mode(return_mode)
    _needs_cuda("gpu_ms")
    import triton.testing
    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms,
                                         grad_to_none=grad_to_none, return_mode=return_mode))


def graph_ms(fn: Callable[[], object], *, rep_ms: float = 100, return_mode: str = "median") -> float:
    """`triton.testing.do_bench_cudagraph`: fn() captured in a CUDA graph and replayed for about
    `rep_ms`; the median (or `return_mode`) ms per call: the GPU's time with no host work in it
    (launch gaps included)."""
    _at_least("rep_ms", rep_ms, 1)
    _return_mode(return_mode)
    _needs_cuda("graph_ms (a CUDA graph replays GPU work)")
    import triton.testing
    return float(triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode=return_mode))


def event_ms(fn: Callable[[], object], repeats: int, *, warmup: int = 1) -> float:
    """Median ms of fn() between two CUDA events recorded around each of `repeats` calls, after
    `warmup` untimed calls; the host waits for the device after each call."""
    _at_least("repeats", repeats, 1)
    _at_least("warmup", warmup, 0)
    _needs_cuda("event_ms")
    for _ in range(warmup):
        fn()
    times_ms = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times_ms.append(start.elapsed_time(end))
    return statistics.median(times_ms)


def host_ms(fn: Callable[[], object], repeats: int, *, warmup: int = 1,
            sync: Callable[[], None] = no_sync, min_total_ms: float = 0.0,
            clock: Clock = time.perf_counter) -> float:
    """Median ms of fn() on the host's clock, each call between two `sync()` calls (so that on a
    GPU the clock holds the device's work), over `repeats` calls after `warmup` untimed ones;
    with `min_total_ms`, calls go on until the timed ones together took that long."""
    _at_least("repeats", repeats, 1)
    _at_least("warmup", warmup, 0)
    _at_least("min_total_ms", min_total_ms, 0)
    for _ in range(warmup):
        fn()
    times_ms: list[float] = []
    begun = clock() if min_total_ms else 0.0
    while len(times_ms) < repeats or (min_total_ms and 1e3 * (clock() - begun) < min_total_ms):
        sync()
        start = clock()
        fn()
        sync()
        times_ms.append(1e3 * (clock() - start))
    return statistics.median(times_ms)


def per_call_ms(fn: Callable[[], object], calls: int, *, warmup: int = 0,
                sync: Callable[[], None] = no_sync, wait_for_device: bool = True,
                clock: Clock = time.perf_counter) -> float:
    """Mean ms per call of `calls` calls issued back to back (no synchronisation between them, as
    a training loop issues its steps), after `warmup` untimed ones and a `sync()`. The clock stops
    after a final `sync()`: the device's time for the whole run; with wait_for_device=False it
    stops before it: the host's time to issue the calls alone (keep `calls` under what the
    device's queue holds)."""
    _at_least("calls", calls, 1)
    _at_least("warmup", warmup, 0)
    for _ in range(warmup):
        fn()
    sync()
    start = clock()
    for _ in range(calls):
        fn()
    if wait_for_device:
        sync()
        elapsed_s = clock() - start
    else:
        elapsed_s = clock() - start
        sync()
    return 1e3 * elapsed_s / calls


def first_call_s(fn: Callable[[], object], *, sync: Callable[[], None] = no_sync,
                 clock: Clock = time.perf_counter) -> float:
    """Seconds of one call between two `sync()` calls: the first call's, which compiles, tunes
    and captures, kept apart from the timed ones."""
    sync()
    start = clock()
    fn()
    sync()
    return clock() - start
