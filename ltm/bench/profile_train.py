"""Where the time of one training step of the GPU profile goes, per mixer (eager, bf16 autocast).

    python -m ltm.bench.profile_train [mixer ...] [--seq-len T] [--batch B] [--compile] [--explain]

mixer: attention, deltanet, rwkv7, hierarchical (the hierarchical DeltaNet, hier_op dual) or
titans (MAG, the linear memory in Triton: titans_depth 1).

For each mixer: the wall time of a step (forward, backward, fused AdamW) and the GPU kernels that
take most of it, from torch.profiler, summed over the profiled steps and divided by their number.
The model section is configs/gpu.yaml's, read from the repository.
"""
from __future__ import annotations

import argparse
import collections

import torch
from torch.profiler import ProfilerActivity, profile

from ltm.bench.provenance import ROOT
from ltm.bench.timing import per_call_ms
from ltm.model.lm import LTM, ModelConfig
from ltm.params import from_mapping, read_params

STEPS = 5


def build(mixer: str, overrides: dict | None = None) -> tuple[LTM, torch.optim.Optimizer]:
    """The GPU profile's model with `mixer` (and the model settings in `overrides`) on the GPU,
    and its fused AdamW."""
    # "hierarchical": the hierarchical DeltaNet, both states in the Triton kernel (hier_op dual)
    extra = {"hierarchical": {"mixer": "deltanet", "hierarchical": True, "hier_op": "dual"},
             "titans": {"mixer": "titans", "titans_depth": 1}}.get(mixer, {"mixer": mixer})
    section = {**read_params(ROOT / "configs" / "gpu.yaml")["model"], **extra, **(overrides or {})}
    model = LTM(from_mapping(ModelConfig, section, "model")).cuda()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)


def step(model: torch.nn.Module, opt: torch.optim.Optimizer, idx: torch.Tensor) -> None:
    """One training step: forward under bf16 autocast, backward, the optimiser."""
    with torch.autocast("cuda", dtype=torch.bfloat16):
        _, loss = model(idx, idx)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def profile_mixer(mixer: str, batch: int, seq_len: int, compiled: bool) -> None:
    """A step's wall time (STEPS back to back after 3 untimed) and its longest GPU kernels."""
    model, opt = build(mixer)
    if compiled:
        model = torch.compile(model)
    idx = torch.randint(0, model.cfg.vocab_size, (batch, seq_len), device="cuda")
    wall = per_call_ms(lambda: step(model, opt, idx), STEPS, warmup=3,
                       sync=torch.cuda.synchronize) / 1e3
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(STEPS):
            step(model, opt, idx)
        torch.cuda.synchronize()
    rows = [(e.device_time_total / STEPS, e.count // STEPS, e.key) for e in prof.key_averages()
            if e.device_time_total > 0 and e.device_type.name == "CUDA"]
    rows.sort(reverse=True)
    gpu = sum(r[0] for r in rows) / 1000
    print(f"-- {mixer}{' compiled' if compiled else ''} B{batch} T{seq_len}: {wall * 1000:.1f} ms per step, "
          f"{gpu:.1f} ms of GPU kernels, {batch * seq_len / wall:,.0f} tokens/s")
    for us, calls, key in rows[:30]:
        print(f"   {us / 1000:8.3f} ms  x{calls:<4d} {key[:100]}")
    del model, opt
    torch.cuda.empty_cache()


def _our_frame(stack: list) -> str:
    """The innermost frame of this project's code in a graph break's stack, as file:line name."""
    ours = [f for f in stack if "/ltm/" in f.filename or "/kernels/" in f.filename]
    frame = (ours or list(stack) or [None])[-1]
    if frame is None:
        return "?"
    return f"{frame.filename.rsplit('/', 2)[-2:]}:{frame.lineno} {frame.name}"


def explain(mixer: str, batch: int, seq_len: int) -> None:
    """torch.compile's view of one training forward: graphs, graph breaks and their reasons (each
    break is a return to Python between compiled graphs, paid on the CPU at every step)."""
    model, _ = build(mixer)
    idx = torch.randint(0, model.cfg.vocab_size, (batch, seq_len), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        report = torch._dynamo.explain(model)(idx, idx)
    # each break: its reason and the innermost frame of this project's code where it happened
    reasons = collections.Counter(
        f"{str(b.reason).splitlines()[0][:120]} at {_our_frame(b.user_stack)}"
        for b in report.break_reasons)
    print(f"-- {mixer}: {report.graph_count} graphs, {report.graph_break_count} graph breaks, "
          f"{report.op_count} ops")
    for reason, count in reasons.most_common(12):
        print(f"   x{count:<4d} {reason}")
    del model
    torch._dynamo.reset()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mixers", nargs="*", default=["attention", "deltanet", "rwkv7"])
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--compile", action="store_true", help="profile the torch.compile'd model")
    parser.add_argument("--explain", action="store_true",
                        help="first print torch.compile's graphs and graph breaks per mixer")
    args = parser.parse_args(argv)
    for mixer in args.mixers if args.explain else []:
        explain(mixer, args.batch, args.seq_len)
    for mixer in args.mixers:
        profile_mixer(mixer, args.batch, args.seq_len, args.compile)


if __name__ == "__main__":
    main()
