"""The report's sections, built from the metrics JSON and plot CSVs that the other stages wrote and
the GPU records kept in git (the page itself: ltm.report.render; its first screen:
ltm.report.headline).

Sections come in the order a researcher asks: does the latent study find that latents carry
information, what changed (this run beside the last commit and each `dvc exp` run, with the
noise), the settings it ran with (folded), training, latent thoughts, the ablation verdicts,
benchmarks, generated text, and the GPU records kept in git, marked as history and folded.
"""
from __future__ import annotations

import datetime
import json
import platform
from pathlib import Path

import pandas as pd
import torch

from ltm.report import compare
from ltm.bench.kernel_grid import grid_summary
from ltm.report.figures import (ablate_figure, benchmark_figures, kernel_grid_figure, latent_by_steps,
                         latent_figure, loss_figure, prior_figure, profile_figure,
                         time_to_loss_figure)
from ltm.params import read_params
from ltm.report.records import latest_grid, read_records, recorded_kernel_rows
from ltm.report.render import human
from ltm.report.gpu import Section


def _read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _read_csv(path: Path) -> pd.DataFrame | None:
    return pd.read_csv(path) if path.is_file() else None


def _missing(title: str, stage: str) -> Section:
    return Section(title, [], [], f"No results: the {stage} stage has not written its metrics.")


def _flat_table(metrics: dict) -> pd.DataFrame:
    flat = pd.json_normalize(metrics, sep=".").T
    flat.columns = ["value"]
    return flat.rename_axis("metric").reset_index()


def summary_section(metrics_dir: Path) -> Section:
    current = compare.metrics_at(None, metrics_dir)
    others = {"last commit": compare.metrics_at("HEAD", metrics_dir)}
    for name, ref in compare.experiment_refs():
        others[f"exp {name}"] = compare.metrics_at(ref, metrics_dir)
    table = compare.summary_table(current, others)
    note = (f"This run beside the last commit and every `dvc exp` run kept here. A change counts "
            f"only beyond {compare.NOISE_SIGMAS:g} x the combined noise the stages measured "
            "(validation loss: standard error over its batches; tokens/s: spread over the timed "
            "windows; the study's gains and the recall margin: standard error over sequences and "
            "seeds); 'noise not measured' where a run did not record it.")
    return Section("Summary: what changed", [table] if not table.empty else [], [], note)


def settings_section(params_path: Path, env: dict) -> Section:
    params = read_params(params_path)
    run = pd.DataFrame([{"setting": k, "value": v} for k, v in env.items()])
    tables = [run]
    changed = compare.changed_params(params_path)
    if not changed.empty:
        tables.append(changed)
    for name in ("model", "train", "data"):
        flat = compare.flatten(params.get(name) or {}, f"{name}.")
        tables.append(pd.DataFrame({"parameter": list(flat), "value": [str(v) for v in flat.values()]}))
    differs = (" Differs from the last commit: " + "; ".join(
        f"{r['parameter']} {r['HEAD']} -> {r['this run']}" for _, r in changed.iterrows()) + "."
        if not changed.empty else " No parameter differs from the last commit.")
    note = ("The device and versions of this report, the commit and whether the workspace differs "
            "from it, the parameters that differ from the last commit (when any), then the model, "
            "train and data sections as run." + differs)
    return Section("Run settings", tables, [], note, folded=True)


def data_section(results_dir: Path) -> Section:
    metrics = _read_json(results_dir / "tokenize.json")
    if metrics is None:
        return _missing("Data", "tokenize")
    return Section("Data", [_flat_table(metrics)], [], "The token cache this run trained on.",
                   folded=True)


# the training metrics a reader looks at first; the full file is in reports/results/train.json
TRAIN_KEYS = ("mixer", "kernel", "n_latent", "params", "steps", "batch_size", "seq_len",
              "train_loss_last10", "val_loss", "val_loss_noise", "tokens_per_s", "tokens_per_s_noise",
              "mfu", "peak_memory_mib", "seconds", "device", "torch",
              # train.target_loss: training seconds and tokens to it (absent when off)
              "optimizer", "target_loss", "time_to_target_s", "tokens_to_target")


def train_section(results_dir: Path, plots_dir: Path) -> Section:
    metrics = _read_json(results_dir / "train.json")
    if metrics is None:
        return _missing("Training", "train")
    # the train stage writes each split to a file of its own (rows: step, seconds, loss)
    read = {split: _read_csv(plots_dir / f"{split}_loss.csv") for split in ("train", "val")}
    curves = [c.assign(split=split) for split, c in read.items() if c is not None and len(c)]
    figures = [loss_figure(pd.concat(curves, ignore_index=True))] if curves else []
    val = read["val"]
    if val is not None and len(val) and {"train_seconds", "tokens"} <= set(val):
        # time to target: the validation loss against the training clock (issue 21)
        name = f"{metrics.get('mixer', 'model')}, {metrics.get('optimizer', 'adamw')}"
        figures.append(time_to_loss_figure({name: val.to_dict("records")},
                                           metrics.get("target_loss")))
    rows = [{"metric": k, "value": metrics[k]} for k in TRAIN_KEYS if k in metrics]
    if metrics.get("kernel_choices"):
        # kernel auto: the implementation each op ran, per shape class
        rows.insert(2, {"metric": "kernel_choices",
                        "value": kernel_choices_line(metrics["kernel_choices"])})
    return Section("Training", [pd.DataFrame(rows)], figures)


def kernel_choices_line(choices: list[dict]) -> str:
    """kernel auto's choices (ltm.ops.auto.chosen) as one line: "delta_rule training bfloat16
    D128 T<=2048 BH/SM 0.25-1: triton; ..."."""
    return "; ".join(f"{c['op']} {c['pass']} {c['dtype']} D{c['D']} T{c['T']} BH/SM "
                     f"{c['bh_per_sm']}: {c['impl']}" for c in choices)


# the comparison table's columns in the report, and their headers
COMPARISON_COLUMNS = {"model": "model", "role": "role", "kind": "kind", "n_latent": "n_latent",
                      "latent_steps": "inner steps", "steps": "steps", "tokens": "tokens",
                      "training_flops": "training FLOPs",
                      "val_loss": "val loss (latent: NELBO bound)",
                      "val_prefix_nll": "suffix NLL given prefix",
                      "val_prefix_ppl": "suffix ppl given prefix", "tokens_per_s": "tokens/s",
                      "skipped": "skipped"}


def gpu_latent_tables(gpu_dir: Path | None) -> list[pd.DataFrame]:
    """The latent-vs-plain comparisons recorded on GPUs (records in gpu_dir holding latent_model,
    from configs/gpu-latent.yaml and `python -m ltm.bench.latent_run`): by inference steps, the
    comparison, and the inner loop's cost against a compiled plain training step."""
    tables = []
    for path, record in ([] if gpu_dir is None else read_records(gpu_dir, "runs", "GPU training")):
        if "latent_model" not in record:
            continue
        where = {"device": record["device"], "commit": record.get("commit"), "record": path.name}
        tables.append(latent_by_steps(record["latent_model"]).assign(**where))
        comparison = pd.DataFrame(record["comparison"])
        shown = [c for c in COMPARISON_COLUMNS if c in comparison]
        tables.append(comparison[shown].rename(columns=COMPARISON_COLUMNS).assign(**where))
        inner = pd.DataFrame(record.get("inner_loop", {}).get("rows", []))
        if not inner.empty:
            tables.append(inner[["case", "impl", "ms", "tokens_per_s", "x_plain"]].assign(**where))
    return tables


def latent_section(results_dir: Path, plots_dir: Path | None = None,
                   gpu_dir: Path | None = None) -> Section:
    """The latent model against the plain ones (the train stage's comparison, ltm.train.counterpart):
    its bound and prefix NLL by inference steps, the table at equal tokens and FLOPs and, with
    plots_dir/compare_loss.csv, every model's validation loss against tokens and FLOPs; then the
    same recorded on GPUs (gpu_dir)."""
    title = "Latent thoughts"
    metrics = _read_json(results_dir / "train.json") or {}
    # the latent model's curves: train.json's latent_model (with counterparts), else the
    # configured model's own (a latent model trained alone)
    latent = metrics.get("latent_model") or (metrics if metrics.get("val_nelbo_by_steps") else None)
    if not latent or not latent.get("val_nelbo_by_steps"):
        return Section(title, [], [], "No latent-thought results: the trained model has no latents "
                                      "(model.n_latent: 0) and no latent counterpart was trained "
                                      "(train.counterpart), or the train stage did not evaluate it.")
    by_steps = latent_by_steps(latent)
    comparison = pd.DataFrame(metrics.get("comparison") or [])
    tables = [by_steps.rename(columns={"NELBO bound": "NELBO bound (nats/token)",
                                       "prefix NLL": "suffix NLL given prefix (nats/token)"})]
    if not comparison.empty:
        shown = [c for c in COMPARISON_COLUMNS if c in comparison]
        tables.append(comparison[shown].rename(columns=COMPARISON_COLUMNS))
    curves = _read_csv(plots_dir / "compare_loss.csv") if plots_dir is not None else None
    note = ("The NELBO is (token NLL + KL(q || prior)) per token with q fitted on the scored "
            "sequence: an upper bound of -log p(x) per token, against a plain model's exact NLL. "
            "The suffix NLL given the prefix fits z on the first half of each sequence and scores "
            "the second half: the number that compares latent and plain models. Equal tokens: the "
            "same steps and batches; equal FLOPs: a plain model trained for as many FLOPs as the "
            "latent model's decoder steps and inner steps together (an estimate).")
    if latent.get("note"):
        note += f" Latent model: {latent['note']}."
    figure = latent_figure(by_steps, comparison if not comparison.empty else None,
                           curves if curves is not None and "model" in curves else None)
    recorded = gpu_latent_tables(gpu_dir)
    if recorded:
        note += (" Below the CPU run's tables: the same comparison recorded on a GPU (by inference "
                 "steps, the models, and the inner loop's cost as a multiple of a compiled plain "
                 "training step at the GPU profile), kept in git because the CPU pipeline cannot "
                 "rerun it.")
    return Section(title, tables + recorded, [figure], note)


# the prior table's columns in the report, and their headers
PRIOR_TABLE = {"source": "source", "sampler": "sampler", "evaluations": "evaluations",
               "ms_per_z": "ms per z", "ms_per_sequence": "ms per sequence",
               "mmd2": "MMD^2", "mmd2_noise": "MMD^2 noise", "fd_pca": "Frechet (PCA)",
               "fd_pca_noise": "Frechet noise", "gen_ppl": "gen. perplexity",
               "gen_nll_noise": "gen. NLL noise", "token_entropy": "token entropy (nats)"}


def prior_section(results_dir: Path, plots_dir: Path) -> Section:
    """The learned prior over latent thoughts (ltm.latent.prior; trained and measured by the train
    stage, ltm.stages.prior): steps against quality, beside N(0, I) and the plain LM."""
    title = "A learned prior over latent thoughts"
    table = _read_csv(plots_dir / "prior.csv")
    metrics = _read_json(results_dir / "prior.json") or {}
    trained = _read_json(results_dir / "prior_train.json") or {}
    if table is None or table.empty:
        why = metrics.get("skipped") or trained.get("skipped") or "the benchmark stage measured none"
        return Section(title, [], [], f"No prior results: {why}.")
    shown = table[[c for c in PRIOR_TABLE if c in table]].rename(columns=PRIOR_TABLE)
    tables = [shown] + prior_answer_tables(metrics)
    note = (f"A DiT denoiser over z ({trained.get('params', '?')} weights, {trained.get('steps', '?')} "
            f"steps) trained on posterior samples of {trained.get('train_sequences', '?')} training "
            f"sequences, fitted by the latent model's own inner loop "
            f"({trained.get('posterior_inner_steps', '?')} inner steps); its denoising loss "
            f"{trained.get('eval_loss_train', float('nan')):.4f} on training and "
            f"{trained.get('eval_loss_heldout', float('nan')):.4f} on held-out posteriors. "
            f"{metrics.get('samples', '?')} z per source against "
            f"{metrics.get('reference_samples', '?')} held-out posterior samples, in the prior's "
            "normalised coordinates: MMD^2 is the unbiased estimate with a Gaussian kernel of the "
            "held-out samples' median distance (the headline; it may be negative), Frechet (PCA) "
            f"the Frechet distance on their top {metrics.get('pca_dims', '?')} principal axes; "
            "noise: jackknife standard errors. Generative perplexity: the generated tokens' NLL "
            "under the train stage's plain LM (its own samples included, for reference); token "
            "entropy: of each sequence's token frequencies (low = repetition). N(mean, std) fit: "
            "the training posteriors' per-dimension Gaussian, what the prior's normalisation alone "
            "gives; the denoiser earns only its lead over that row.")
    if "fewest_dpm_evaluations_matching_ddpm" in metrics:
        note += (f" Answers: DPM-Solver++ matches the 1000-step DDPM from "
                 f"{metrics['fewest_dpm_evaluations_matching_ddpm']} evaluations "
                 f"({human(metrics.get('fewer_evaluations_x'))}x fewer); the prior's MMD^2 is "
                 f"{human(metrics.get('prior_mmd2_over_best_gaussian'))} times the best Gaussian's "
                 f"({metrics.get('best_gaussian', '?')}).")
    return Section(title, tables, [prior_figure(table)], note)


def prior_answer_tables(metrics: dict) -> list[pd.DataFrame]:
    """The prior benchmark's answers as two small tables: DPM-Solver++ at each number of
    evaluations against the 1000-step DDPM (ratios), and the pairwise verdicts per distance."""
    ratios = [{"DPM-Solver++ evaluations": int(key[3:-len("_mmd2_ratio_to_ddpm")]),
               "MMD^2 / DDPM's": value,
               "gen. perplexity / DDPM's": metrics.get(key.replace("mmd2", "gen_ppl"))}
              for key, value in metrics.items() if key.startswith("dpm") and key.endswith("_mmd2_ratio_to_ddpm")]
    verdicts = metrics.get("verdicts") or {}
    pairs = sorted({pair for by_pair in verdicts.values() for pair in by_pair})
    verdict_rows = [{"comparison": pair, **{name: verdicts[name].get(pair, "") for name in verdicts}}
                    for pair in pairs]
    return [pd.DataFrame(rows) for rows in (ratios, verdict_rows) if rows]


def ablate_section(plots_dir: Path, results_dir: Path | None = None) -> Section:
    """The verdict of each change and, from the ablate stage's results, where a training step's
    time goes (the baseline's and the final configuration's profile by operation group)."""
    table = _read_csv(plots_dir / "ablate.csv")
    if table is None:
        return _missing("Ablation verdicts", "ablate")
    note = ("Each change against the baseline on the same validation batches; see the ablate "
            "stage's notebook for the protocol; reports/plots/ablate.csv holds every column.")
    shown = [c for c in ABLATE_COLUMNS if c in table]
    figures = [ablate_figure(table)]
    results = _read_json(Path(results_dir) / "ablate.json") if results_dir else None
    profile = pd.DataFrame([{"config": config, "group": group, "ms": ms}
                            for config, groups in ((results or {}).get("profile") or {}).items()
                            for group, ms in groups.items()])
    if not profile.empty:
        figures.append(profile_figure(profile))
    return Section("Ablation verdicts", [table[shown]], figures, note)


# the ablate table's columns on the page
ABLATE_COLUMNS = ["switch", "kind", "verdict", "kept", "speedup", "step_ms", "val_loss",
                  "delta_val_loss", "tolerance", "peak_memory_mib", "note"]


def benchmark_tables(table: pd.DataFrame) -> list[pd.DataFrame]:
    """One table per question (benchmark group): cases down, implementations across, ms."""
    tables = []
    for group, rows in table.groupby("group", sort=False):
        wide = rows.pivot_table(index="case", columns="impl", values="ms", sort=False)
        wide.columns = [f"{c} ms" for c in wide.columns]
        tables.append(wide.dropna(axis=1, how="all").rename_axis(group).reset_index())
    return tables


def benchmark_section(plots_dir: Path) -> Section:
    table = _read_csv(plots_dir / "benchmark.csv")
    if table is None:
        return _missing("Benchmarks", "benchmark")
    note = "Measured by this run's benchmark stage on the device named in the run settings."
    return Section("Benchmarks", benchmark_tables(table), benchmark_figures(table), note)


def samples_section(samples_path: Path | None) -> Section:
    title = "Generated text"
    if samples_path is None or not samples_path.is_file():
        return Section(title, [], [], "No samples: the train stage wrote none.")
    samples = json.loads(samples_path.read_text())
    table = pd.DataFrame(samples["samples"])
    # line breaks as " / ", the way verse is quoted: one short paragraph per sample on the page
    if "text" in table:
        table["text"] = table["text"].astype(str).str.strip().str.replace(r"\s*\n+\s*", " / ", regex=True)
    settings = ", ".join(f"{k}={v}" for k, v in samples.get("settings", {}).items())
    return Section(title, [table], [], f"Sampled from the trained checkpoint ({settings}).")


def kernel_history_section(folder: Path) -> Section:
    """The newest kernel grid per op (its summary, the figure) and one row per kernel record; the
    raw rows stay in the records."""
    table = recorded_kernel_rows(folder)
    title = "Kernel benchmarks on GPUs (recorded history)"
    if table.empty:
        return Section(title, [], [], f"No kernel benchmark records in {folder}.")
    per_record = (table.groupby("record", sort=False)
                  .agg(device=("device", "first"), commit=("commit", "first"),
                       ops=("op", lambda ops: ", ".join(sorted(set(ops)))), rows=("ms", "size"))
                  .reset_index())
    per_record["commit"] = per_record["commit"].astype(str).str[:8]
    note = ("Measured on the devices and at the commits named, kept in git (records/bench) because "
            "the CPU pipeline cannot rerun them: history, not measurements of this commit. The "
            "last table: one row per record (its raw rows are in the file).")
    rows = latest_grid(folder)
    if not rows:
        return Section(title, [per_record], [], note, folded=True)
    note = ("Per op and pass, the newest kernel-grid record: x_fla = fla ms / ours ms (above 1, "
            "ours is faster), the geometric mean and the worst shape over the grid; the figure "
            "gives each shape's time over its floor (rings: the same calls replayed from a CUDA "
            "graph, GPU time only). " + note)
    return Section(title, [pd.DataFrame(grid_summary(rows)), per_record],
                   [kernel_grid_figure(pd.DataFrame(rows))], note, folded=True)


def environment() -> dict:
    """Versions, device, the commit and whether the workspace differs from it (one git call)."""
    state = compare.workspace_state()
    dirty = "yes: " + ", ".join(state["changed_files"]) if state["dirty"] else "no"
    return {"python": platform.python_version(), "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
            "commit": state["commit"], "uncommitted changes": dirty,
            "built": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
