import os

import torch

# Triton kernels run through Triton's interpreter where there is no GPU; the variable must be set
# before any kernel module is imported, which is why it is set here, first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# the interpreter re-patches triton.language at every call of a jit helper inside a kernel, the
# kernel tests' largest cost on the CPU: skipped where already in force (tests/interpreter_patching.py)
if os.environ.get("TRITON_INTERPRET") == "1":
    from tests.interpreter_patching import install

    install()

# kernel buffers start as NaN in the tests, so an output element a kernel never writes fails them
os.environ["LTM_POISON_BUFFERS"] = "1"

# Under pytest-xdist (make test: a worker process per core) each worker gets its share of the
# cores, and so do the processes a test starts (dvc repro, the CLI): two workers each spinning two
# OpenMP threads on two cores run several times slower than one thread each.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _share = max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    os.environ["OMP_NUM_THREADS"] = str(_share)
    torch.set_num_threads(_share)


import pytest  # noqa: E402

from tests.each_choice import select  # noqa: E402


@pytest.fixture
def one_thread():
    """One intra-op thread for the test: tiny ops on a shared two-core machine only slow down
    with a second spinning thread. A module takes it with
    `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# the longest test files, first: under pytest-xdist (a file per worker at a time) a long file that
# starts last keeps one core busy alone at the end (test_pipeline.py, three dvc repro runs: ~9 min)
LONGEST_FIRST = ("tests/test_pipeline.py", "tests/kernels/test_kernels_shared_memory.py",
                 "tests/kernels/test_kernels_delta_rule.py", "tests/kernels/test_kernels_launch_options.py",
                 "tests/study/test_contenders.py", "tests/bench/test_kernel_grid.py")


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        path = item.nodeid.split("::")[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: every other test keeps its order
    select(config, items)  # make test-newest: each value of each parametrize list once
