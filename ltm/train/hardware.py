"""What the training loop asks of the machine: processes and devices, mixed precision, how
large a batch fits, peak memory and the peak FLOP rate that MFU is measured against."""
from __future__ import annotations

import contextlib
import os
import resource

import torch
import torch.distributed as dist
from torch import nn

from ltm.params import ParamsError

# bf16 dense tensor-core peak of one H100 / H200 SXM, the denominator of MFU
H100_BF16_PEAK = 989e12


def autocast(device: torch.device, amp: str):
    if amp == "off":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if amp == "bf16" else torch.float16)


def setup_distributed(device_name: str) -> tuple[torch.device, int, int]:
    """(device, rank, world size); joins the process group when started by torchrun."""
    want_cuda = device_name == "cuda" or (device_name == "auto" and torch.cuda.is_available())
    if want_cuda and not torch.cuda.is_available():
        raise ParamsError("train.device: cuda asked for, but torch sees no CUDA device")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if want_cuda else "gloo")
    if want_cuda:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), rank, world
    return torch.device("cpu"), rank, world


def find_batch_size(loss_model: nn.Module, seq_len: int, vocab_size: int, amp: str,
                    memory_fraction: float, device: torch.device, say) -> int:
    """batch_size auto: the largest power of two whose forward + backward of loss_model(x, y),
    plus AdamW's two float32 moments, fits in memory_fraction of the GPU. On the CPU: 16, with
    a note."""
    if device.type != "cuda":
        say("batch_size auto: memory is not probed on the CPU; using 16")
        return 16
    total = torch.cuda.get_device_properties(device).total_memory
    moments = 2 * sum(p.numel() * 4 for p in loss_model.parameters())
    best, batch = 0, 1
    while batch <= 4096:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        try:
            x = torch.randint(vocab_size, (batch, seq_len), device=device)
            with autocast(device, amp):
                loss = loss_model(x, x)
            loss.backward()
            fits = torch.cuda.max_memory_allocated(device) + moments <= memory_fraction * total
        except torch.OutOfMemoryError:
            fits = False
        loss_model.zero_grad(set_to_none=True)
        loss = x = None
        if not fits:
            break
        best, batch = batch, batch * 2
    torch.cuda.empty_cache()
    # the run's peak memory is the training's, not the probe's
    torch.cuda.reset_peak_memory_stats(device)
    if best == 0:
        raise RuntimeError(f"batch_size auto: not even one sequence of {seq_len} tokens fits")
    say(f"batch_size auto: {best} sequences per micro-step fit in {memory_fraction:.0%} of "
        f"{total / 2**30:.0f} GiB")
    return best


def peak_memory(device: torch.device) -> tuple[float, str]:
    """Peak memory in MiB and what was measured."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "cuda max_memory_allocated"
    # ru_maxrss is in KiB on Linux: the whole process's peak resident memory
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cpu process peak RSS"


def peak_flops(device: torch.device, amp: str) -> float | None:
    """The bf16 dense peak for an H100 / H200; None (no MFU) for other devices."""
    if device.type == "cuda" and amp != "off":
        name = torch.cuda.get_device_name(device)
        if "H100" in name or "H200" in name:
            return H100_BF16_PEAK
    return None


# compiled configurations one process may hold per code object (see `allow_recompiles`)
RECOMPILE_LIMIT = 64


def allow_recompiles(limit: int = RECOMPILE_LIMIT) -> None:
    """Raise dynamo's per-code-object recompile limit (8 by default) to `limit`.

    Every compiled model of one process adds an entry to the caches of the same code objects (the
    block's, the mixer's, the loss's forward), one per configuration. Past the limit dynamo warns
    once and runs that code eagerly from then on: the ablate protocol (a model per switch, all in
    one process) and gpu/hierarchical_bench.py measured their later rows partly eager that way
    (the H100 runs of 2026-11-23 hit it at the 8th configuration)."""
    config = torch._dynamo.config
    # renamed from cache_size_limit in torch 2.6; the old name still answers on 2.11 and 2.13
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), limit))
