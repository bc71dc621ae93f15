"""Independent CPU jobs spread over worker processes, one per core by default.

Tiny models use a second core poorly within one process (each op is too small to split), so the
study and the recall benchmark train their independent models side by side, each in a process of
its own with cores / workers intra-op threads. Every job seeds itself: its result does not depend
on which worker ran it (up to the rounding of a different thread count). On a GPU, or with one
worker, the jobs run one after the other in this process.
"""
from __future__ import annotations

import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Callable, Iterable

import torch


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_workers(asked: int, jobs: int, device: torch.device) -> int:
    """Worker processes for `jobs` jobs: `asked` (0 = one per core), at most one per job; on a
    GPU always 1 (the jobs share the device, and a process each would hold a CUDA context)."""
    if device.type != "cpu":
        return 1
    return max(1, min(jobs, asked or cores()))


def _with_threads(threads: int, fn: Callable, args: tuple) -> Any:
    torch.set_num_threads(threads)
    return fn(*args)


def run_jobs(fn: Callable, jobs: list[tuple], workers: int,
             on_done: Callable[[int, Any], None] | None = None) -> list:
    """[fn(*job) for job in jobs], in the jobs' order, run by `workers` processes at once (each
    with cores / workers threads; fn and the jobs must pickle) or here when workers is 1.
    on_done(index, result) is called as each job finishes. List the longest jobs first: they
    start first."""
    results: list = [None] * len(jobs)

    def finished(done: Iterable[tuple[int, Any]]) -> None:
        for index, result in done:
            results[index] = result
            if on_done is not None:
                on_done(index, result)

    if workers == 1:
        finished((i, fn(*job)) for i, job in enumerate(jobs))
        return results
    threads = max(1, cores() // workers)
    # spawned, not forked: a forked child of a process whose OpenMP pool ran can hang
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(_with_threads, threads, fn, job): i for i, job in enumerate(jobs)}
        finished((futures[f], f.result()) for f in as_completed(futures))
    return results
