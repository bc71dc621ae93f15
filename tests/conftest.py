import os

import torch

# Triton kernels run through Triton's interpreter where there is no GPU; the variable must be set
# before any kernel module is imported, which is why it is set here, first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# kernel buffers start as NaN in the tests, so an output element a kernel never writes fails them
os.environ["LTM_POISON_BUFFERS"] = "1"
