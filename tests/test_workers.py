"""ltm.workers: how many worker processes, results in the jobs' order whichever finished first,
each worker's thread count, the same answer here and in workers, and no worker left behind."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ltm.workers import cores, cpu_workers, run_jobs

ROOT = Path(__file__).resolve().parents[1]


def seeded_draw(seed: int, wait_s: float) -> tuple[int, list[float], int]:
    """A job that seeds itself; the first job waits so that the second finishes first."""
    import time
    time.sleep(wait_s)
    torch.manual_seed(seed)
    return seed, torch.randn(3).tolist(), torch.get_num_threads()


def failing_job(text: str) -> None:
    raise ValueError(text)


def test_one_worker_per_core_at_most_one_per_job_and_one_on_a_gpu():
    cpu = torch.device("cpu")
    assert cpu_workers(0, 100, cpu) == cores()
    assert cpu_workers(0, 1, cpu) == 1
    assert cpu_workers(3, 2, cpu) == 2 and cpu_workers(3, 10, cpu) == 3
    assert cpu_workers(4, 10, torch.device("cuda")) == 1


def test_results_come_back_in_the_jobs_order_the_same_here_and_in_workers():
    jobs = [(0, 1.0), (1, 0.0), (2, 0.0)]
    finished = []
    spread = run_jobs(seeded_draw, jobs, 2, lambda i, r: finished.append(i))
    here = run_jobs(seeded_draw, jobs, 1)
    assert [r[0] for r in spread] == [0, 1, 2] and sorted(finished) == [0, 1, 2]
    assert finished[-1] == 0  # the slow first job finished last, its result still first
    assert [r[1] for r in spread] == [r[1] for r in here]
    # each of the two workers gets its share of the cores
    assert all(r[2] == max(1, cores() // 2) for r in spread)


def test_a_failing_job_raises_its_own_error():
    with pytest.raises(ValueError, match="bad input"):
        run_jobs(failing_job, [("bad input",), ("bad input",)], 2)


def write_after(folder: str, name: str, wait_s: float) -> str:
    """A job that writes a file named `name` after wait_s seconds."""
    import time
    time.sleep(wait_s)
    Path(folder, name).write_text(name)
    return name


def read_written(folder: str, name: str) -> tuple[str, int, int]:
    """A follow-up that reads what its job wrote (FileNotFoundError if it started too early), and
    says where it ran: its pid and thread count."""
    return "read " + Path(folder, name).read_text(), os.getpid(), torch.get_num_threads()


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("first", ["slow", "fast"])
def test_a_follow_up_starts_after_its_job_and_comes_after_the_jobs(tmp_path, workers, first):
    # the slow job sleeps long enough for the fast one to end first on a busy machine
    jobs = [(str(tmp_path), "slow", 4.0), (str(tmp_path), "fast", 0.0)]
    job = 0 if first == "slow" else 1
    seen = []
    results = run_jobs(write_after, jobs, workers, lambda i, r: seen.append((i, r)),
                       after={job: (read_written, (str(tmp_path), first))})
    assert results[:2] == ["slow", "fast"] and results[2][0] == f"read {first}"
    assert sorted(i for i, _ in seen) == [0, 1, 2]
    assert [i for i, _ in seen].index(job) < [i for i, _ in seen].index(2)
    # beside a job still running, in the worker just freed; after the last job, here, where
    # every core is free
    beside = workers == 2 and first == "fast"
    assert (results[2][1] != os.getpid()) == beside
    assert results[2][2] == (max(1, cores() // 2) if beside else torch.get_num_threads())


def pid_then_sleep(folder: str, index: int) -> None:
    """A job that says where it runs (a file named by its pid), then outlives any test."""
    import pathlib
    pathlib.Path(folder, f"{index}-{os.getpid()}").touch()
    time.sleep(120)


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody has reaped yet."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_workers_exit_when_their_parent_is_killed(tmp_path):
    script = ("from ltm.workers import run_jobs; from tests.test_workers import pid_then_sleep; "
              f"run_jobs(pid_then_sleep, [({str(tmp_path)!r}, 0), ({str(tmp_path)!r}, 1)], 2)")
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
    try:
        deadline = time.monotonic() + 120  # two spawned interpreters importing torch, on a busy CI
        while len(list(tmp_path.iterdir())) < 2:
            assert parent.poll() is None and time.monotonic() < deadline, "the workers never started"
            time.sleep(0.2)
    finally:
        parent.kill()
        parent.wait()
    pids = [int(p.name.split("-")[1]) for p in tmp_path.iterdir()]
    deadline = time.monotonic() + 30
    while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = [pid for pid in pids if not _gone(pid)]
    for pid in alive:  # leave nothing behind, then fail
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"workers {alive} outlived their killed parent by 30 s"
