"""Independent CPU jobs spread over worker processes, one per core by default.

Tiny models use a second core poorly within one process (each op is too small to split), so the
study and the recall benchmark train their independent models side by side, each in a process of
its own with cores / workers intra-op threads. Every job seeds itself: its result does not depend
on which worker ran it (up to the rounding of a different thread count). On a GPU, or with one
worker, the jobs run one after the other in this process. A worker whose parent is gone (killed,
not stopped by Ctrl-C) exits within a second instead of training on for nobody.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
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


def _exit_when_orphaned(parent: int, poll_s: float = 1.0) -> None:
    """Poll the parent's pid; once this process has been handed to another parent (the one that
    started it was killed), leave at once: its results could reach no one."""
    while os.getppid() == parent:
        time.sleep(poll_s)
    os._exit(1)


def _start_worker(threads: int, parent: int) -> None:
    """Each worker process, once: its share of the cores, and the orphan watch."""
    torch.set_num_threads(threads)
    threading.Thread(target=_exit_when_orphaned, args=(parent,), daemon=True).start()


def run_jobs(fn: Callable, jobs: list[tuple], workers: int,
             on_done: Callable[[int, Any], None] | None = None,
             after: dict[int, tuple[Callable, tuple]] | None = None) -> list:
    """[fn(*job) for job in jobs], in the jobs' order, run by `workers` processes at once (each
    with cores / workers threads; fn and the jobs must pickle) or here when workers is 1.
    on_done(index, result) is called as each job finishes. List the longest jobs first: they
    start first. `after` maps a job's index to a follow-up (fn, args) started once that job has
    finished (it may read what the job wrote): on the worker just freed while other jobs still
    run, else here, on every core, once the workers are gone. The follow-ups' results come after
    the jobs', in the order of their jobs' indices, and on_done sees them at those indices too."""
    follow = sorted((after or {}).items())
    results: list = [None] * (len(jobs) + len(follow))
    slot = {index: len(jobs) + k for k, (index, _) in enumerate(follow)}

    def finished(index: int, result: Any) -> None:
        results[index] = result
        if on_done is not None:
            on_done(index, result)

    if workers == 1:
        for i, job in enumerate(jobs):
            finished(i, fn(*job))
            if i in slot:
                follow_fn, args = after[i]
                finished(slot[i], follow_fn(*args))
        return results
    threads = max(1, cores() // workers)
    # spawned, not forked: a forked child of a process whose OpenMP pool ran can hang
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_start_worker,
                             initargs=(threads, os.getpid())) as pool:
        pending = {pool.submit(fn, *job): i for i, job in enumerate(jobs)}
        here = []  # follow-ups of the last jobs to finish
        while pending:
            done = next(as_completed(pending))
            index = pending.pop(done)
            finished(index, done.result())
            if index in slot and pending:  # beside the jobs still running, on the worker freed
                follow_fn, args = after[index]
                pending[pool.submit(follow_fn, *args)] = slot[index]
            elif index in slot:  # nothing else runs: one thread in a worker would idle a core
                here.append(index)
    for index in here:
        follow_fn, args = after[index]
        finished(slot[index], follow_fn(*args))
    return results
