"""The benchmark stage: token mixers (naive loop vs chunked vs SDPA), cached vs uncached
generation, and the recurrence kernels, on whatever device runs the stage."""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pandas as pd
import torch

from ltm.bench.kernels import KernelBenchConfig
from ltm.bench.kernels import run as run_kernels
from ltm.bench.latent import LatentBench, bench_latent
from ltm.device import device_name, resolve_device
from ltm.bench.model import GENERATE_IMPLS, bench_generate, bench_generate_memory, bench_mixers
from ltm.model.lm import ModelConfig
from ltm.params import check, from_mapping, load_section, read_params


@dataclass
class MixerBench:
    batch: int = 1
    seq_len: int = 256
    backward: bool = True
    repeats: int = 3  # timed runs; the median is reported


@dataclass
class GenerateBench:
    batches: list[int] = field(default_factory=lambda: [1])  # tokens/s at each batch size
    prompt_len: int = 16
    new_tokens: int = 64
    repeats: int = 2
    # of uncached (recompute the sequence per token), cached (LTM.generate), static (ltm.generate's
    # Decoder, a CUDA graph on a GPU), compiled, int8, int8-compiled, int4, int4-compiled
    impls: list[str] = field(default_factory=lambda: ["uncached", "cached", "static"])
    # generation state and time per token against context length (empty: none)
    contexts: list[int] = field(default_factory=lambda: [64, 256])

    def __post_init__(self) -> None:
        check(len(self.batches) > 0 and all(b >= 1 for b in self.batches), "batches",
              f"must be one or more sizes >= 1, got {self.batches}")
        check(all(impl in GENERATE_IMPLS for impl in self.impls), "impls",
              f"each must be one of {', '.join(GENERATE_IMPLS)}, got {self.impls}")
        check(all(n >= 2 for n in self.contexts), "contexts", f"must be >= 2, got {self.contexts}")


@dataclass
class BenchmarkConfig:
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # vocabulary of the generation benchmark's model (its other sizes are the model section's)
    vocab_size: int = 2048
    mixers: MixerBench = field(default_factory=MixerBench)
    generate: GenerateBench = field(default_factory=GenerateBench)
    kernels: KernelBenchConfig = field(default_factory=KernelBenchConfig)
    # the inner loop of latent thoughts against a plain training step
    latent: LatentBench = field(default_factory=LatentBench)

    def __post_init__(self) -> None:
        check(self.vocab_size >= 2, "vocab_size", f"must be >= 2, got {self.vocab_size}")


def _mixer_rows(model_cfg: ModelConfig, cfg: MixerBench, device: torch.device) -> list[dict]:
    rows = bench_mixers(model_cfg, cfg.batch, cfg.seq_len, backward=cfg.backward,
                        repeats=cfg.repeats, device=device)
    return [dict(r, group=f"mixer {r['pass']} B={r['B']} T={r['T']}", case=r["mixer"]) for r in rows]


def _generate_rows(model_cfg: ModelConfig, cfg: GenerateBench, device: torch.device) -> list[dict]:
    rows = []
    for batch in cfg.batches:
        rows += [dict(r, group=f"generate {cfg.new_tokens} tokens B={batch}", case=r["mixer"])
                 for r in bench_generate(model_cfg, batch, cfg.prompt_len, cfg.new_tokens,
                                         impls=tuple(cfg.impls), repeats=cfg.repeats,
                                         device=device)]
    memory = bench_generate_memory(model_cfg, tuple(cfg.contexts), device=device)
    return rows + [dict(r, group="generate state", case=f"{r['mixer']} L={r['context']}")
                   for r in memory]


def _kernel_rows(cfg: KernelBenchConfig, device: torch.device) -> list[dict]:
    rows = run_kernels(cfg, device=str(device))
    return [dict(r, group=f"{r['op']} {r['pass']}", case=f"{r['B']},{r['T']},{r['H']},{r['D']}")
            for r in rows]


def summarise(table: pd.DataFrame, device: torch.device) -> dict:
    """The headline numbers for `dvc metrics`: speed-up of each fast path over its slow original."""
    mixers = table[table.group.str.startswith("mixer ") & (table["pass"] == "forward")
                   & (table.impl == "torch")]
    generate = table[table.group.str.startswith("generate") & (table.impl == "cached")]
    summary = {"device": device_name(device),
               "torch": torch.__version__,
               "chunk_vs_naive_forward": dict(zip(mixers.case, mixers.speedup.round(3))),
               "cached_vs_uncached_generate": dict(zip(generate.case, generate.speedup.round(3)))}
    if "x_plain" in table:  # the inner loop: multiples of a plain training step, per impl
        latent = table[table.group.str.startswith("latent training") & table.x_plain.notna()]
        summary["latent_x_plain_step"] = {f"{r.case} {r.impl}": round(r.x_plain, 3)
                                          for r in latent.itertuples() if r.case != "plain step"}
    return summary


def write_plot_tables(table: pd.DataFrame, folder: str | Path) -> None:
    """One CSV per benchmark group (an op or a mixer and a pass, a measure) in `folder`, so that
    `dvc plots` draws one chart per question instead of stacking unrelated rows into one bar;
    each row labelled "case impl"."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.csv"):
        old.unlink()
    for group, rows in table.groupby("group", sort=False):
        slug = re.sub(r"[^a-z0-9]+", "-", str(group).lower()).strip("-")
        rows = rows.assign(label=rows["case"].astype(str) + " " + rows["impl"].astype(str))
        rows[["label", "case", "impl", "ms", "speedup"]].to_csv(folder / f"{slug}.csv", index=False)


def benchmark_stage(params_path: str | Path, metrics_path: str | Path, plot_path: str | Path,
                    plot_dir: str | Path) -> tuple[pd.DataFrame, dict]:
    """Run every benchmark of the `benchmark` section on this machine; write the headline metrics,
    all rows (plot_path) and one plot table per group (plot_dir). Returns (rows, metrics). Paths
    come from dvc.yaml."""
    cfg = load_section(BenchmarkConfig, "benchmark", params_path)
    model_cfg = from_mapping(ModelConfig, read_params(params_path).get("model"), "model")
    model_cfg = dataclasses.replace(model_cfg, vocab_size=model_cfg.vocab_size or cfg.vocab_size)
    device = resolve_device(cfg.device, "benchmark.device")
    rows = (_mixer_rows(model_cfg, cfg.mixers, device) + _generate_rows(model_cfg, cfg.generate, device)
            + _kernel_rows(cfg.kernels, device) + bench_latent(model_cfg, cfg.latent, device))
    table = pd.DataFrame(rows)
    front = ["group", "case", "impl", "ms", "speedup"]
    table = table[front + [c for c in table.columns if c not in front]]
    for path in (metrics_path, plot_path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    metrics = summarise(table, device)
    Path(metrics_path).write_text(json.dumps(metrics, indent=1) + "\n")
    table.to_csv(plot_path, index=False)
    write_plot_tables(table, plot_dir)
    return table, metrics
