import os

import torch

# Triton kernels run through Triton's interpreter where there is no GPU; the variable must be set
# before any kernel module is imported, which is why it is set here, first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# kernel buffers start as NaN in the tests, so an output element a kernel never writes fails them
os.environ["LTM_POISON_BUFFERS"] = "1"


import pytest  # noqa: E402


@pytest.fixture
def one_thread():
    """One intra-op thread for the test: tiny ops on a shared two-core machine only slow down
    with a second spinning thread. A module takes it with
    `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
