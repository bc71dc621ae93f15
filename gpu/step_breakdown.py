"""Where a compiled GPT-2-small training step's GPU time goes, ours against the nanoGPT-class loop:
kernel time per category (matmuls, attention, loss, optimiser, the rest), from torch.profiler.

    python3 gpu/step_breakdown.py [--params configs/gpu-levers.yaml] [--steps 5] [--top N]

Both models at the params' size, batch and length, bf16 autocast, fused AdamW, random tokens.
Categories go by kernel name: cuBLAS / CUTLASS GEMMs ("nvjet", "gemm", "cutlass", "sm90_xmma"),
attention (cuDNN / flash / memory-efficient SDPA), the loss (Inductor's fused log-softmax / nll
kernels), the optimiser (multi-tensor apply, AdamW), everything else (Inductor's elementwise and
reduction kernels: norms, activations, RoPE, residuals, casts).
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpt2_baseline  # noqa: E402
from source_checkout import ROOT  # noqa: E402, F401

from ltm.train.objective import LossModel  # noqa: E402
from ltm.model.lm import LTM, ModelConfig  # noqa: E402
from ltm.params import from_mapping, read_params  # noqa: E402

CATEGORIES = [("matmul", ("nvjet", "gemm", "cutlass", "sm90_xmma", "triton_mm", "splitk")),
              ("attention", ("cudnn", "flash", "fmha", "attention", "sdpa")),
              ("loss", ("nll", "log_softmax", "cross_entropy")),
              ("optimiser", ("multi_tensor", "adam"))]


def category(kernel: str) -> str:
    name = kernel.lower()
    for label, keys in CATEGORIES:
        if any(key in name for key in keys):
            return label
    return "other"


def step_fns(params: dict) -> dict:
    """One training step (forward, backward, AdamW) per model, each compiled the way its loop is."""
    section, train = params["model"], params["train"]
    B, T = train["batch_size"], train["seq_len"]
    plain = gpt2_baseline.GPT(vocab=section["vocab_size"], d=section["d_model"],
                              n_layers=section["n_layers"], n_heads=section["n_heads"]).cuda()
    ours = LTM(from_mapping(ModelConfig, section, "model")).cuda()
    loss_ours = torch.compile(LossModel(ours, False, True, None))  # as the trainer compiles it
    fns = {}
    for name, model, loss in (("nanoGPT-class", plain, torch.compile(plain)), ("ours", ours, loss_ours)):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

        def step(model=model, loss=loss, opt=opt):
            x = torch.randint(section["vocab_size"], (B, T + 1), device="cuda")
            with torch.autocast("cuda", torch.bfloat16):
                value = loss(x[:, :-1], x[:, 1:])
            value.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        fns[name] = step
    return fns


def breakdown(step, steps: int, top: int = 0) -> dict:
    for _ in range(4):  # compile and warm
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    totals, others = collections.Counter(), collections.Counter()
    for event in prof.key_averages():
        if event.device_type == torch.autograd.DeviceType.CUDA:  # kernels, not the ops above them
            ms, label = event.self_device_time_total / 1e3 / steps, category(event.key)
            totals[label] += ms
            if label == "other":
                others[event.key[:110]] += ms
    for kernel, ms in others.most_common(top):
        print(f"  other {ms:6.3f} ms  {kernel}")
    return dict(totals)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", default="configs/gpu-levers.yaml")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=0, help="list the N longest 'other' kernels")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("step_breakdown: needs a CUDA GPU (it profiles CUDA kernels)")
    torch.backends.cuda.matmul.allow_tf32 = True
    results = {}
    for name, fn in step_fns(read_params(args.params)).items():
        print(name)
        results[name] = breakdown(fn, args.steps, args.top)
    labels = [label for label, _ in CATEGORIES] + ["other"]
    print("GPU ms per step | " + " | ".join(labels) + " | total")
    for name, totals in results.items():
        cells = [f"{totals.get(label, 0.0):.2f}" for label in labels]
        print(f"{name} | " + " | ".join(cells) + f" | {sum(totals.values()):.2f}")


if __name__ == "__main__":
    main()
