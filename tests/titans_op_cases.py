"""What the Titans kernel tests of both depths (tests/kernels/test_kernels_titans*.py) share: the
op under kernel "triton" against "torch", continuing a state that a prefill left anywhere."""
from __future__ import annotations

import torch

from ltm.ops.titans import titans_memory, titans_memory_one_token


def triton_and_torch_from_any_state(x: dict, weights: list, prefill: int, chunk_size: int = 16,
                                    grad_clip: float = 0.5) -> dict[str, list[torch.Tensor]]:
    """Per kernel ("torch", "triton"), after `prefill` tokens of `x` run by torch: the outputs of
    the rest, one decoding step's output after them, every tensor of the final state (weights,
    momenta and chunk-start weights of every layer) and the gradients of every input and initial
    weight."""
    results = {}
    for kernel in ("torch", "triton"):
        state = None
        if prefill:
            _, state = titans_memory(*(t[:, :prefill] for t in x.values()), weights, kernel="torch",
                                     chunk_size=chunk_size, grad_clip=grad_clip,
                                     output_final_state=True)
        o, state = titans_memory(*(t[:, prefill:] for t in x.values()), weights, kernel=kernel,
                                 chunk_size=chunk_size, grad_clip=grad_clip, initial_state=state,
                                 output_final_state=True)
        o_step, state = titans_memory_one_token(*(t[:, -1] for t in x.values()), weights, state,
                                                kernel=kernel, chunk_size=chunk_size,
                                                grad_clip=grad_clip)
        grads = torch.autograd.grad(o.square().sum() + o_step.sum(), [*x.values(), *weights])
        results[kernel] = [o, o_step, *(t for part in state[:3] for t in part), *grads]
    return results
