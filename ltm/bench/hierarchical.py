"""The hierarchical DeltaNet layer's forward and forward+backward time under the roadmap's
switches, cumulatively, against its own start and against the plain DeltaNet layer (issue 17).

    python -m ltm.bench.hierarchical OUT.json [--batch 16] [--seq-len 1024] [--repeats 20]
    python -m ltm.bench.hierarchical OUT.json --tiny      # small shapes on the CPU, seconds

One DeltaNet layer of the GPU profile (configs/gpu.yaml: d_model 768, 12 heads, kernel triton,
short convolution fused) on random bf16-autocast inputs, TF32 on, each configuration wrapped in
torch.compile (--no-compile: eager). Rows, each on top of the one before (the order of
configs/gpu-hierarchical.yaml): start (stacked, gate), + hier_op=dual, + fused_proj, +
chunk_size=128, + hier_mix=sum, + hier_fast_read=chunk, + hier_slow_threshold=0.5; then the plain
DeltaNet layer. Every configuration runs untimed first (compilation, autotuning); its time is the
median of --repeats, CUDA events around each call (the host clock on the CPU). x_start = start ms / row ms (the target: >= 2
on fwd+bwd), x_plain = plain ms / row ms (the model-level target, 0.95x the plain tokens/s, is
the ablate run's last row). OUT.json is rewritten after each row. About 2-3 minutes on one H100
(compilation of eight layers dominates).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from ltm.bench.timing import event_ms, host_ms
from ltm.device import device_name
from ltm.model.config import ModelConfig
from ltm.model.mixers import DeltaNet
from ltm.train.hardware import allow_recompiles

STEPS = [("start", {}), ("+ hier_op=dual", {"hier_op": "dual"}),
         ("+ fused_proj", {"fused_proj": True}), ("+ chunk_size=128", {"chunk_size": 128}),
         ("+ hier_mix=sum", {"hier_mix": "sum"}), ("+ hier_fast_read=chunk", {"hier_fast_read": "chunk"}),
         ("+ hier_slow_threshold=0.5", {"hier_slow_threshold": 0.5})]


def configs(base: ModelConfig) -> list[tuple[str, ModelConfig]]:
    """The cumulative rows, then the plain layer."""
    rows, settings = [], {}
    for name, change in STEPS:
        settings.update(change)
        rows.append((name, dataclasses.replace(base, **settings)))
    rows.append(("plain deltanet", dataclasses.replace(base, hierarchical=False)))
    return rows


def timed(fn: Callable[[], None], repeats: int, device: torch.device) -> float:
    """Median ms of `fn()` over `repeats` calls after one untimed call."""
    if device.type == "cuda":
        return event_ms(fn, repeats, warmup=1)
    return host_ms(fn, repeats, warmup=1)


def measure(cfg: ModelConfig, x: torch.Tensor, repeats: int, compile: bool) -> dict:
    """fwd_ms and fwd_bwd_ms of one layer of `cfg` on x (compiled if asked)."""
    torch.manual_seed(0)
    layer = DeltaNet(cfg).to(x.device)
    if compile:
        allow_recompiles()  # eight configurations of one layer class in one process
    run = torch.compile(layer) if compile else layer
    amp = torch.autocast(x.device.type, torch.bfloat16, enabled=x.device.type == "cuda")
    xg = x.detach().requires_grad_()

    def forward():
        with torch.no_grad(), amp:
            run(x)

    def forward_backward():
        with amp:
            y, _ = run(xg)
        y.float().square().mean().backward()
        layer.zero_grad(set_to_none=True)
        xg.grad = None

    return {"fwd_ms": timed(forward, repeats, x.device),
            "fwd_bwd_ms": timed(forward_backward, repeats, x.device)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--tiny", action="store_true", help="CPU, small shapes, kernel torch")
    args = parser.parse_args(argv)
    started = time.monotonic()
    if args.tiny:
        device, compile = torch.device("cpu"), False
        base = ModelConfig(vocab_size=16, mixer="deltanet", hierarchical=True, d_model=64,
                           n_heads=4, kernel="torch", max_seq_len=4096)
        B, T, repeats = 2, 200, 3
    else:
        device, compile = torch.device("cuda"), not args.no_compile
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        base = ModelConfig(vocab_size=50304, mixer="deltanet", hierarchical=True, d_model=768,
                           n_heads=12, kernel="triton", max_seq_len=8192)
        B, T, repeats = args.batch, args.seq_len, args.repeats
    x = torch.randn(B, T, base.d_model, device=device)
    record = {"device": device_name(device),
              "torch": torch.__version__, "shape": {"batch": B, "seq_len": T,
              "d_model": base.d_model, "n_heads": base.n_heads}, "compile": compile, "rows": []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for name, cfg in configs(base):
        row = {"config": name, **measure(cfg, x, repeats, compile)}
        record["rows"].append(row)
        out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"{name:28s} fwd {row['fwd_ms']:8.3f} ms  fwd+bwd {row['fwd_bwd_ms']:8.3f} ms",
              flush=True)
    start, plain = record["rows"][0], record["rows"][-1]
    for row in record["rows"]:
        for key in ("fwd_ms", "fwd_bwd_ms"):
            row[f"x_start_{key[:-3]}"] = start[key] / row[key]
            row[f"x_plain_{key[:-3]}"] = plain[key] / row[key]
    record["wall_s"] = round(time.monotonic() - started, 1)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{'config':28s} {'fwd ms':>8s} {'fwd+bwd':>8s} {'x_start':>8s} {'x_plain':>8s}")
    for row in record["rows"]:
        print(f"{row['config']:28s} {row['fwd_ms']:8.3f} {row['fwd_bwd_ms']:8.3f} "
              f"{row['x_start_fwd_bwd']:8.2f} {row['x_plain_fwd_bwd']:8.2f}")
    print(f"wrote {out} in {record['wall_s']:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
