"""The report stage: one self-contained HTML page (tables and seaborn figures embedded) built from
the metrics JSON and plot CSVs that the other stages wrote."""
from __future__ import annotations

import base64
import datetime
import html
import io
import json
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import seaborn as sns
import torch
from matplotlib.figure import Figure

from ltm.figures import ablate_figure, benchmark_figures, loss_figure
from ltm.params import load_section
from ltm.records import read_records


@dataclass
class ReportConfig:
    title: str = "ltm workbook"
    dpi: int = 110  # resolution of the embedded figures


@dataclass
class Section:
    title: str
    tables: list[pd.DataFrame]
    figures: list[Figure]
    note: str = ""


def _read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _read_csv(path: Path) -> pd.DataFrame | None:
    return pd.read_csv(path) if path.is_file() else None


def _missing(title: str, stage: str) -> Section:
    return Section(title, [], [], f"No results: the {stage} stage has not written its metrics.")


def _flat_table(metrics: dict) -> pd.DataFrame:
    flat = pd.json_normalize(metrics, sep=".").T
    flat.columns = ["value"]
    return flat


def data_section(metrics_dir: Path) -> Section:
    metrics = _read_json(metrics_dir / "tokenize.json")
    if metrics is None:
        return _missing("Data", "tokenize")
    return Section("Data", [_flat_table(metrics)], [])


def train_section(metrics_dir: Path, plots_dir: Path) -> Section:
    metrics, curve = _read_json(metrics_dir / "train.json"), _read_csv(plots_dir / "train_loss.csv")
    if metrics is None:
        return _missing("Training", "train")
    figures = [loss_figure(curve)] if curve is not None and len(curve) else []
    return Section("Training", [_flat_table(metrics)], figures)


def ablate_section(plots_dir: Path) -> Section:
    table = _read_csv(plots_dir / "ablate.csv")
    if table is None:
        return _missing("Speed switches", "ablate")
    note = ("Each switch is flipped alone on top of the baseline and trained for the same number "
            "of steps; quality is preserved where the validation loss stays within the tolerance.")
    return Section("Speed switches", [table], [ablate_figure(table)], note)


def benchmark_section(plots_dir: Path) -> Section:
    table = _read_csv(plots_dir / "benchmark.csv")
    if table is None:
        return _missing("Benchmarks", "benchmark")
    return Section("Benchmarks", [table], benchmark_figures(table))


def recorded_kernel_rows(folder: Path) -> pd.DataFrame:
    """The kernel benchmarks recorded on GPUs (`python -m ltm.bench.kernels --out ...`, kept in
    `folder`): one row per measurement with the device and commit it was made on. They are
    history, not this commit's metrics: the benchmark stage measures only what runs here."""
    rows = []
    for path, record in read_records(folder, "rows", "kernel benchmark"):
        for row in record["rows"]:
            rows.append({"device": record["device"], "commit": record.get("commit"),
                         "op": row["op"], "pass": row["pass"],
                         "case": f"{row['B']},{row['T']},{row['H']},{row['D']}",
                         "impl": row["impl"], "ms": row["ms"], "record": path.name})
    return pd.DataFrame(rows)


def kernel_history_section(folder: Path) -> Section:
    table = recorded_kernel_rows(folder)
    title = "Kernel benchmarks on GPUs (recorded history)"
    if table.empty:
        return Section(title, [], [], f"No kernel benchmark records in {folder}.")
    note = ("Measured on the devices and at the commits named, kept in git because the CPU "
            "pipeline cannot rerun them: history, not measurements of this commit.")
    return Section(title, [table], [], note)


def gpu_training_rows(folder: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The training runs recorded on GPUs (`gpu/train.sh`, `gpu/ddp.sh`) and kept as JSON in
    `folder`: one table of runs and one of DDP scaling. A file that is not such a record is an
    error, not a silent gap in the report."""
    runs, scaling = [], []
    for path, record in read_records(folder, "runs", "GPU training"):
        runs += [dict(row, device=record["device"], record=path.name) for row in record["runs"]]
        if record.get("ddp"):
            ddp = record["ddp"]
            scaling.append({"device": ddp["device"], "run": ddp["run"], "commit": ddp["commit"],
                            "tokens_per_s_1": ddp["one_gpu"]["tokens_per_s"],
                            "tokens_per_s_2": ddp["two_gpus"]["tokens_per_s"],
                            "speedup": ddp["speedup"], "record": path.name})
    columns = ["device", "run", "commit", "seq_len", "batch_size", "tokens_per_s", "mfu",
               "peak_memory_mib", "record"]
    return pd.DataFrame(runs, columns=columns), pd.DataFrame(scaling)


def gpu_figure(runs: pd.DataFrame) -> Figure:
    """Tokens per second of each recorded GPU run, longest sequences apart by colour."""
    fig = Figure(figsize=(8, 0.35 * len(runs) + 1.5))
    ax = fig.subplots()
    sns.barplot(data=runs, y="run", x="tokens_per_s", hue="seq_len", dodge=False, ax=ax)
    ax.set_title("training tokens/s per recorded GPU run (higher is better)")
    fig.tight_layout()
    return fig


def gpu_section(gpu_dir: Path) -> Section:
    runs, scaling = gpu_training_rows(gpu_dir)
    if runs.empty:
        return Section("Training on GPUs (recorded)", [], [],
                       f"No GPU training records in {gpu_dir}.")
    note = ("Measured with gpu/train.sh and gpu/ddp.sh on the devices named, kept in git as JSON "
            "because the CPU pipeline cannot rerun them; MFU is against 989 TFLOP/s (dense bf16).")
    tables = [runs] + ([scaling] if not scaling.empty else [])
    return Section("Training on GPUs (recorded)", tables, [gpu_figure(runs)], note)


def environment() -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {"commit": commit, "python": platform.python_version(), "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
            "built": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def _figure_html(fig: Figure, dpi: int) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    encoded = base64.b64encode(buffer.getvalue()).decode()
    return f'<img alt="figure" src="data:image/png;base64,{encoded}">'


def render_html(title: str, sections: list[Section], env: dict, dpi: int) -> str:
    parts = [f"<h1>{html.escape(title)}</h1>",
             "<p class=env>" + " · ".join(f"{k}: {html.escape(str(v))}" for k, v in env.items()) + "</p>"]
    for section in sections:
        parts.append(f"<h2>{html.escape(section.title)}</h2>")
        if section.note:
            parts.append(f"<p>{html.escape(section.note)}</p>")
        parts += [_figure_html(fig, dpi) for fig in section.figures]
        parts += [table.to_html(float_format=lambda x: f"{x:.4g}", border=0) for table in section.tables]
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;font-size:0.85em;margin:1em 0}"
             "td,th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}"
             ".env{color:#666;font-size:0.85em}img{max-width:100%}")
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n")


def report_stage(params_path: str | Path, metrics_dir: str | Path, plots_dir: str | Path,
                 bench_records: str | Path, gpu_records: str | Path,
                 output: str | Path) -> list[Section]:
    """Build the report from whatever the stages wrote, and the GPU records (kernel benchmarks in
    `bench_records`, training runs in `gpu_records`) as history; returns the sections for the
    notebook. Paths come from dvc.yaml."""
    cfg = load_section(ReportConfig, "report", params_path)
    metrics_dir, plots_dir = Path(metrics_dir), Path(plots_dir)
    sns.set_theme(style="whitegrid")
    sections = [data_section(metrics_dir), train_section(metrics_dir, plots_dir),
                ablate_section(plots_dir), benchmark_section(plots_dir),
                kernel_history_section(Path(bench_records)), gpu_section(Path(gpu_records))]
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    Path(output).write_text(render_html(cfg.title, sections, environment(), cfg.dpi))
    return sections
