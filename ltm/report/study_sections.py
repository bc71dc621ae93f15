"""The report's two latent-study sections: this run's study (the first section, under the
verdict lines of ltm.report.headline) and the studies recorded on GPUs (folded history). Their
tables and figure come from ltm.report.study, which the study notebook shows too."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ltm.report.gpu import Section
from ltm.report.records import read_records
from ltm.report.study import bound_figure, encoder_table, inner_lr_sentence, study_table


STUDY_NOTE = ("Suffix NLL: the second half of each validation sequence given the first, nats/token, "
              "mean ± SE over sequences and training seeds (study.seeds: every model trained anew "
              "per seed; the SE adds the seeds' spread); gain = control - latent, paired (positive: "
              "latent better), counted beyond 5 SE. Within a seed all models train on the same "
              "batches; decoders see study.window "
              "tokens per layer, so z is the only channel beyond them. Dynamic evaluation: the plain "
              "model takes as many SGD steps on the prefix as the latent model takes inference steps "
              "(best step size). Second table: the bound NLL + KL after the encoder and k steps, and "
              "the cold-start steps that match it.")


def published_sentence(study: dict) -> str:
    """The latent model's bound as the LTM authors report it (q and its noise fitted to the
    scored text) against the honest bound and IWAE-64, per source, in one sentence."""
    parts = []
    for source, s in (study.get("sources") or {}).items():
        b = s.get("published_beside_ours")
        if b:
            parts.append(f"{source} {b['published_bound']['mean']:.3f} against {b['honest_bound']['mean']:.3f} "
                         f"(IWAE-64 {b['iwae_64']['mean']:.3f}; optimism {b['optimism']['mean']:+.3f} ± "
                         f"{b['optimism']['se']:.3f})")
    if not parts:
        return ""
    return (" The bound as the LTM authors report it (q and noise fitted to the scored text) against "
            "the honest one (fresh noise), nats/token: " + "; ".join(parts) + " (the study notebook's "
            "last table).")


def study_section(results_dir: Path) -> Section:
    """The report's first section: this run's latent study, its verdict, its table, what the
    encoder buys and the bound by inference steps (the studies recorded on GPUs have a folded
    section of their own, `recorded_study_section`)."""
    title = "Do latent thoughts carry information? The verdict"
    path = Path(results_dir) / "study.json"
    study = json.loads(path.read_text()) if path.is_file() else None
    if not (study and study.get("enabled")):
        why = "study.enabled is false" if study else "the study stage wrote no study.json"
        return Section(title, [], [], f"No latent study in this run: {why}.")
    # the verdict lines head the page (ltm.report.headline); the published bound as one
    # sentence, its table in the study notebook (the page's height is held to a limit)
    return Section(title, [study_table(study), encoder_table(study)], [bound_figure(study)],
                   STUDY_NOTE + inner_lr_sentence(study) + published_sentence(study))


def recorded_study_section(records_dir: Path) -> Section:
    """The latent study and the latent step's cost recorded on GPUs (JSON with `study` and
    `speed`, see records/gpu/study), folded like every recorded history."""
    title = "The latent study on GPUs (recorded history)"
    recorded = read_records(records_dir, "speed", "GPU study") if Path(records_dir).is_dir() else []
    if not recorded:
        return Section(title, [], [], f"No GPU study records in {records_dir}.")
    tables, notes = [], []
    for name, record in recorded:
        where = name.stem  # the record's file, named with its device and date
        tables += [study_table(record["study"]).assign(recorded=where),
                   encoder_table(record["study"]).assign(recorded=where)]
        if record["speed"]:
            tables.append(pd.DataFrame(record["speed"]).assign(recorded=where))
        notes.append(f"{record['device']}, {name.name}, commit {str(record.get('commit'))[:8]}"
                     + (" (with the latent training step at the GPU profile as a multiple of a "
                        "compiled plain step, x_plain)" if record["speed"] else ""))
    note = ("The study's tables as recorded on GPUs (the column `recorded`). " + "; ".join(notes)
            + ".")
    return Section(title, tables, [], note, folded=True)
