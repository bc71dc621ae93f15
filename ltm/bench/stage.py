"""The benchmark stage: token mixers (naive loop vs chunked vs SDPA), cached vs uncached
generation, and the recurrence kernels, on whatever device runs the stage."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pandas as pd
import torch

from ltm.bench.kernels import KernelBenchConfig
from ltm.bench.kernels import run as run_kernels
from ltm.bench.model import bench_generate, bench_mixers
from ltm.model import ModelConfig
from ltm.params import check, from_mapping, load_section, read_params
from ltm.records import read_records


@dataclass
class MixerBench:
    batch: int = 1
    seq_len: int = 256
    backward: bool = True
    repeats: int = 3  # timed runs; the median is reported


@dataclass
class GenerateBench:
    batch: int = 1
    prompt_len: int = 16
    new_tokens: int = 64
    repeats: int = 3


@dataclass
class BenchmarkConfig:
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # vocabulary of the generation benchmark's model (its other sizes are the model section's)
    vocab_size: int = 2048
    mixers: MixerBench = field(default_factory=MixerBench)
    generate: GenerateBench = field(default_factory=GenerateBench)
    kernels: KernelBenchConfig = field(default_factory=KernelBenchConfig)

    def __post_init__(self) -> None:
        check(self.vocab_size >= 2, "vocab_size", f"must be >= 2, got {self.vocab_size}")


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _mixer_rows(model_cfg: ModelConfig, cfg: MixerBench, device: torch.device) -> list[dict]:
    rows = bench_mixers(model_cfg, cfg.batch, cfg.seq_len, backward=cfg.backward,
                        repeats=cfg.repeats, device=device)
    return [dict(r, group=f"mixer {r['pass']} B={r['B']} T={r['T']}", case=r["mixer"]) for r in rows]


def _generate_rows(model_cfg: ModelConfig, cfg: GenerateBench, device: torch.device) -> list[dict]:
    rows = bench_generate(model_cfg, cfg.batch, cfg.prompt_len, cfg.new_tokens,
                          repeats=cfg.repeats, device=device)
    return [dict(r, group=f"generate {cfg.new_tokens} tokens", case=r["mixer"]) for r in rows]


def _kernel_rows(cfg: KernelBenchConfig, device: torch.device) -> list[dict]:
    rows = run_kernels(cfg, device=str(device))
    return [dict(r, group=f"{r['op']} {r['pass']}", case=f"{r['B']},{r['T']},{r['H']},{r['D']}")
            for r in rows]


def recorded_rows(folder: str | Path) -> list[dict]:
    """The kernel benchmarks recorded on GPUs: every JSON that `python -m ltm.bench.kernels`
    wrote and that is kept in `folder`, one row per measurement, grouped by device, so that a
    CPU run of the stage still reports them. A file that is not such a record is an error."""
    rows = []
    for path, record in read_records(folder, "rows", "kernel benchmark"):
        device, measured = record["device"], record["rows"]
        # the commit is part of the group: a record of older kernels must not pass for today's
        at = f" at {record['commit']}" if record.get("commit") else ""
        for row in measured:
            rows.append(dict(row, group=f"{row['op']} {row['pass']} on {device}{at} (recorded)",
                             case=f"{row['B']},{row['T']},{row['H']},{row['D']}",
                             record=path.name, commit=record.get("commit")))
    return rows


def summarise(table: pd.DataFrame, device: torch.device) -> dict:
    """The headline numbers for `dvc metrics`: speed-up of each fast path over its slow original."""
    mixers = table[table.group.str.startswith("mixer ") & (table["pass"] == "forward")
                   & (table.impl == "torch")]
    generate = table[table.group.str.startswith("generate") & (table.impl == "cached")]
    summary = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "torch": torch.__version__,
               "chunk_vs_naive_forward": dict(zip(mixers.case, mixers.speedup.round(3))),
               "cached_vs_uncached_generate": dict(zip(generate.case, generate.speedup.round(3)))}
    if "record" in table:
        # fla's time over ours, per recorded GPU case: above 1, ours is faster
        ours = table[table.record.notna() & (table.impl == "triton") & table.x_fla.notna()]
        summary["recorded_fla_over_triton"] = {f"{g} {c}": round(x, 3) for g, c, x
                                               in zip(ours.group, ours.case, ours.x_fla)}
    return summary


def benchmark_stage(params_path: str | Path = "params.yaml",
                    metrics_path: str | Path = "reports/metrics/benchmark.json",
                    plots_path: str | Path = "reports/plots/benchmark.csv",
                    records_dir: str | Path = "reports/bench") -> pd.DataFrame:
    """Run every benchmark of the `benchmark` section, add the GPU records of `records_dir`;
    write the headline metrics and all rows."""
    cfg = load_section(BenchmarkConfig, "benchmark", params_path)
    model_cfg = from_mapping(ModelConfig, read_params(params_path).get("model"), "model")
    model_cfg = dataclasses.replace(model_cfg, vocab_size=model_cfg.vocab_size or cfg.vocab_size)
    device = _device(cfg.device)
    rows = (_mixer_rows(model_cfg, cfg.mixers, device) + _generate_rows(model_cfg, cfg.generate, device)
            + _kernel_rows(cfg.kernels, device) + recorded_rows(records_dir))
    table = pd.DataFrame(rows)
    front = ["group", "case", "impl", "ms", "speedup"]
    table = table[front + [c for c in table.columns if c not in front]]
    for path in (metrics_path, plots_path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(metrics_path).write_text(json.dumps(summarise(table, device), indent=1) + "\n")
    table.to_csv(plots_path, index=False)
    return table
