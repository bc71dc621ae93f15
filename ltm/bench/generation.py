"""Generation on one GPU, the table of issue #16: per mixer, LTM.generate (eager) against
ltm.generate's static decoder (CUDA graph), compiled and int8.

    python -m ltm.bench.generation OUT.json [--budget SECONDS]
    python -m ltm.bench.generation OUT.json --smoke     # the same sections, tiny, on the CPU

The GPU profile's model (configs/gpu.yaml: 12 layers, d_model 768, vocab 50304, Triton kernels)
with random weights in bf16, greedy. Sections, most important first; every path runs once before
it is timed (Triton and inductor compile, CUDA graph capture), and OUT.json is rewritten after
each section, so a run cut short keeps what it measured:

1. prompt 256, 256 new tokens: prefill ms, ms per token, tokens/s at batch 1, 16 and 64
2. cached (eager and graph) against recomputing the whole sequence, 1024 new tokens, batch 1
3. generation state and step time against context length, 1k to 32k, batch 1
4. int8 weights: loss change on random tokens, speed at batch 1 (graph)
5. torch.compile'd step (then captured), bf16 and int8, batch 1: compiling takes longest, so
   last; a section whose turn comes after --budget seconds (default 360) is listed as skipped.

Needs torch with CUDA, Triton, and torchao for the int8 rows (an error row otherwise).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Callable

import torch

from ltm.bench.model import VARIANTS, bench_generate, bench_generate_memory, bench_quantization
from ltm.bench.provenance import ROOT, commit, version_of
from ltm.model.lm import ModelConfig
from ltm.params import from_mapping, read_params

MIXERS = {name: VARIANTS[name] for name in ("attention", "deltanet", "rwkv7")}
# prompt, new tokens, new tokens against recomputing, batch sizes, context lengths
SIZES = dict(prompt=256, new=256, long_new=1024, batches=(1, 16, 64),
             contexts=(1024, 4096, 8192, 16384, 32768))
# --smoke: a check that every section runs, in seconds on a CPU
SMOKE_SIZES = dict(prompt=8, new=6, long_new=12, batches=(1, 2), contexts=(64, 128))
SMOKE_MODEL = dict(vocab_size=512, n_layers=1, d_model=64, n_heads=2, kernel="torch")
COLUMNS = ("mixer", "impl", "B", "context", "prefill_ms", "ms_per_token", "tokens_per_s",
           "speedup", "cache_mib", "peak_mib", "loss_delta", "same", "error")


class Run:
    """Sections run under a time budget, each section's rows printed and saved as they come."""

    def __init__(self, out: Path, budget: float, cfg: ModelConfig, device: str, dtype) -> None:
        self.out, self.budget, self.start = out, budget, time.perf_counter()
        self.record = {
            "device": torch.cuda.get_device_name(0) if device == "cuda" else device,
            "torch": torch.__version__, "triton": version_of("triton"),
            "torchao": version_of("torchao"), "commit": commit(short=True),
            "model": dataclasses.asdict(cfg),
            "dtype": str(dtype), "sections": {}, "skipped": []}

    def section(self, name: str, work: Callable[[], list[dict]]) -> None:
        """Run `work` unless the budget is spent (then listed as skipped); print and save its rows."""
        if time.perf_counter() - self.start > self.budget:
            self.record["skipped"].append(name)
            print(f"\n== {name}: skipped (past the budget of {self.budget:.0f} s)", flush=True)
            return
        began = time.perf_counter()
        rows = work()
        self.record["sections"][name] = {"seconds": round(time.perf_counter() - began, 1),
                                         "rows": rows}
        print(f"\n== {name} ({time.perf_counter() - began:.0f} s)\n{_table(rows)}", flush=True)
        self.out.write_text(json.dumps(self.record, indent=1, default=str) + "\n")


def _table(rows: list[dict]) -> str:
    """The rows as a right-aligned text table of the COLUMNS they hold."""
    columns = [c for c in COLUMNS if any(c in r for r in rows)]
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
    return "" if value is None else str(value)[:60]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="JSON record to write")
    parser.add_argument("--budget", type=float, default=360.0,
                        help="seconds after which no further section starts")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, on the CPU")
    args = parser.parse_args(argv)
    cfg = from_mapping(ModelConfig, read_params(ROOT / "configs" / "gpu.yaml")["model"], "model")
    size, device, dtype = SIZES, "cuda", torch.bfloat16
    if args.smoke:
        cfg, size = dataclasses.replace(cfg, **SMOKE_MODEL), SMOKE_SIZES
        device, dtype = "cpu", torch.float32
    elif not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device: this benchmark measures generation on a GPU "
                         "(--smoke runs it on the CPU)")
    common = dict(device=device, dtype=dtype, variants=MIXERS)
    prompt, new = size["prompt"], size["new"]
    run = Run(args.out, args.budget, cfg, device, dtype)

    def batches():
        return [row for batch in size["batches"] for row in bench_generate(
            cfg, batch, prompt, new, impls=("cached", "static"), warmup=1, repeats=2, **common)]

    run.section(f"prompt {prompt}, {new} new tokens", batches)
    run.section(f"cached vs recompute, {size['long_new']} new tokens", lambda: bench_generate(
        cfg, 1, prompt, size["long_new"], impls=("uncached", "cached", "static"), warmup=0,
        repeats=1, **common))
    run.section("state vs context", lambda: bench_generate_memory(cfg, size["contexts"], **common))
    tokens = torch.randint(0, cfg.vocab_size, (4, 8, prompt + new + 1),
                           generator=torch.Generator().manual_seed(0))
    run.section("quantised loss on random tokens", lambda: bench_quantization(
        cfg, ("int8", "int4"), [(t[:, :-1], t[:, 1:]) for t in tokens], **common))
    run.section("int8 speed", lambda: bench_generate(
        cfg, 1, prompt, new, impls=("static", "int8"), warmup=1, repeats=2, **common))
    for name in MIXERS:
        run.section(f"compiled {name}", lambda name=name: bench_generate(
            cfg, 1, prompt, new, impls=("static", "compiled", "int8-compiled"), warmup=1,
            repeats=2, **{**common, "variants": {name: MIXERS[name]}}))
    print(f"\nwrote {args.out} after {time.perf_counter() - run.start:.0f} s")


if __name__ == "__main__":
    main()
