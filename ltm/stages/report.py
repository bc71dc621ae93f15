"""The report stage: one self-contained HTML page (ltm.report.page) built from the metrics JSON and
plot CSVs that the other stages wrote and the curated GPU records; the `report` section of
params.yaml gives its title and the figures' resolution.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import seaborn as sns

from ltm.params import load_section
from ltm.report.auto_records import auto_gpu_section
from ltm.report.headline import headline
from ltm.report.render import render_html, rendered_sections
from ltm.report.recall import recall_section
from ltm.report.references import kernel_references_section
from ltm.report.titans_records import titans_gpu_section
from ltm.report.gpu import Section, gpu_ablate_section, gpu_section, gpu_time_to_target_section
from ltm.report.page import (ablate_section, benchmark_section, data_section, environment,
                             kernel_history_section, latent_section, prior_section,
                             samples_section, settings_section, summary_section, train_section)
from ltm.report.study_sections import recorded_study_section, study_section


@dataclass
class ReportConfig:
    title: str = "ltm workbook"
    dpi: int = 110  # resolution of the embedded figures


def report_stage(params_path: str | Path, metrics_dir: str | Path, results_dir: str | Path,
                 plots_dir: str | Path, bench_records: str | Path, gpu_records: str | Path,
                 output: str | Path, samples_path: str | Path | None = None) -> list[Section]:
    """Build the report from whatever the stages wrote (their results files, and their headline
    metrics for the comparison with the last commit and each experiment), and the GPU records
    (kernel benchmarks in `bench_records`, training runs in `gpu_records`, ablate runs in its
    ablate/) as history; returns the sections for the notebook. Paths come from dvc.yaml."""
    cfg = load_section(ReportConfig, "report", params_path)
    results, plots_dir = Path(results_dir), Path(plots_dir)
    sns.set_theme(style="whitegrid")
    env = environment()
    summary = summary_section(Path(metrics_dir))
    lines = headline(results, Path(bench_records),
                     summary.tables[0] if summary.tables else pd.DataFrame())
    sections = [study_section(results), summary,
                settings_section(Path(params_path), env),
                data_section(results), train_section(results, plots_dir),
                latent_section(results, plots_dir, Path(gpu_records)),
                prior_section(results, plots_dir), ablate_section(plots_dir, results),
                benchmark_section(plots_dir), recall_section(results, plots_dir, env["commit"]),
                samples_section(Path(samples_path) if samples_path else None),
                kernel_history_section(Path(bench_records)),
                kernel_references_section(Path(bench_records) / "references"),
                gpu_section(Path(gpu_records)),
                recorded_study_section(Path(gpu_records) / "study"),
                titans_gpu_section(Path(gpu_records) / "titans"),
                auto_gpu_section(Path(gpu_records) / "auto"),
                gpu_ablate_section(Path(gpu_records) / "ablate"),
                gpu_time_to_target_section(Path(gpu_records) / "ttt")]
    # drawn once, for the page and the notebook alike
    sections = rendered_sections(sections, cfg.dpi)
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    Path(output).write_text(render_html(cfg.title, sections, env, cfg.dpi, lines))
    return sections
