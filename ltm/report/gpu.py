"""The report's sections on what was measured on GPUs and kept in git as history (the CPU
pipeline cannot rerun it): training runs, the ablate protocol's verdicts, and time to a target
loss per optimiser (`gpu/levers_bench.py --parts ttt`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from ltm.report.figures import ablate_figure, time_to_loss_figure
from ltm.report.records import gpu_ablate_records, read_records


@dataclass
class Section:
    title: str
    tables: list[pd.DataFrame]
    figures: list[Figure]  # or, once drawn for the page, ltm.report.render.RenderedFigure
    note: str = ""
    folded: bool = False  # figures and tables behind a "show" toggle (history, full settings)


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
        return Section("Training on GPUs (recorded history)", [], [],
                       f"No GPU training records in {gpu_dir}.")
    note = ("Measured with gpu/train.sh and gpu/ddp.sh on the devices named, kept in git as JSON "
            "because the CPU pipeline cannot rerun them; MFU is against 989 TFLOP/s (dense bf16).")
    tables = [runs] + ([scaling] if not scaling.empty else [])
    return Section("Training on GPUs (recorded history)", tables, [gpu_figure(runs)], note,
                   folded=True)


# the columns of a GPU ablate record the report shows (the CSV has the baseline's too)
GPU_ABLATE_COLUMNS = ["switch", "kind", "verdict", "speedup", "speedup_low", "speedup_high",
                      "step_ms", "delta_val_loss", "peak_memory_mib", "note"]


def gpu_ablate_section(folder: Path) -> Section:
    """The ablate protocol's runs on GPUs (`gpu/ablate.py`), one verdict table and figure each."""
    title = "Ablation verdicts on GPUs (recorded history)"
    records = gpu_ablate_records(folder)
    if not records:
        return Section(title, [], [], f"No GPU ablate records in {folder}.")
    runs = "; ".join(f"{name}: {p['device']}, torch {p.get('torch')}, commit "
                     f"{str(p.get('commit'))[:7]}, {p.get('params')}"
                     + "".join(f" --set {item}" for item in p.get("overrides") or [])
                     for name, p, _ in records)
    # a folded section shows its note's first sentence: a short one, the runs after it
    note = ("Measured with gpu/ablate.py and kept in git: history, not measurements of this "
            "commit. In the order of the files: " + runs + ".")
    return Section(title, [table[GPU_ABLATE_COLUMNS] for _, _, table in records],
                   [ablate_figure(table) for _, _, table in records], note, folded=True)


# the columns of a time-to-target record the report shows, one row per run
TTT_COLUMNS = ["name", "optimizer", "batch", "lr", "steps", "val_loss", "final_minus_reference",
               "equal_quality", "tokens_per_s", "time_to_target_s", "tokens_to_target", "speedup",
               "worst_fixed_target_speedup", "worst_vs_equal_adamw"]


def gpu_time_to_target_section(folder: Path) -> Section:
    """Time to a target loss per optimiser and batch on GPUs (`gpu/levers_bench.py --parts ttt`,
    its OUT.json kept in `folder`): per record, a table of its runs and the validation loss
    against time and tokens."""
    title = "Time to a target loss on GPUs (recorded history)"
    records = read_records(folder, "ttt", "time-to-target")  # a missing folder holds none
    if not records:
        return Section(title, [], [], f"No time-to-target records in {folder}.")
    tables, figures, notes = [], [], []
    for path, record in records:
        ttt = record["ttt"]
        if not isinstance(ttt, dict) or "runs" not in ttt or "target_loss" not in ttt:
            raise ValueError(f"{path}: a time-to-target record without scored runs "
                             f"({ttt.get('skipped') if isinstance(ttt, dict) else ttt})")
        rows = []
        for name, run in ttt["runs"].items():
            fixed = [x for x in (run.get("fixed_targets") or {}).values() if x]
            rows.append({**{k: run.get(k) for k in TTT_COLUMNS}, "name": name,
                         "worst_fixed_target_speedup": min(fixed) if fixed else None})
        tables.append(pd.DataFrame(rows, columns=TTT_COLUMNS))
        figures.append(time_to_loss_figure({n: r["curve"] for n, r in ttt["runs"].items()},
                                           ttt["target_loss"]))
        notes.append(f"{path.name}: {record['device']}, torch {record.get('torch')}, commit "
                     f"{str(record.get('commit'))[:7]}, {'compiled' if ttt.get('compile') else 'eager'}, seed {ttt.get('seed', '-')}, "
                     f"target {ttt['target_loss']:.4f} (the final loss of {ttt.get('reference', 'AdamW')})")
    note = ("Measured with gpu/levers_bench.py and kept in git: history, not measurements of this "
            "commit. The same tokens per run; speedup = the reference's seconds to the target / the run's "
            "(training seconds, evaluations left out); the worst speedup over the fixed targets "
            "both runs reach; equal quality: final loss at most the tolerance above the "
            "reference's; worst_vs_equal_adamw: the smallest speedup at a fixed target against "
            "any AdamW run of equal quality. " + "; ".join(notes) + ".")
    return Section(title, tables, figures, note, folded=True)
