"""The whole workbook through `dvc repro`, on a tiny corpus, in a temporary copy of the repository."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest
import yaml

from ltm.notebook import run_notebook

ROOT = Path(__file__).resolve().parents[1]

# every stage at the smallest real scope: a few seconds of work each
TINY = {
    "data": {"source": "data/raw/tiny", "vocab_size": 300,
             "synthetic": {"length": 32, "train_sequences": 64, "val_sequences": 8}},
    "model": {"n_layers": 1, "d_model": 32, "n_heads": 2, "max_seq_len": 64},
    "train": {"steps": 12, "batch_size": 4, "seq_len": 32, "eval_every": 6, "eval_batches": 2,
              "warmup_steps": 2, "log_every": 2, "timing_warmup": 2, "checkpoint_every": 6,
              "latent": {"eval_steps": [0, 1], "eval_batches": 1},
              "counterpart": {"eval_steps": [0, 1], "eval_batches": 1, "max_equal_flops_steps": 24}},
    # the prior over z at its smallest: a few steps on a few posteriors
    "prior": {"width": 16, "n_heads": 2, "steps": 6, "batch_size": 8, "warmup_steps": 1,
              "checkpoint_every": 3, "train_sequences": 16, "heldout_sequences": 16, "fit_batch": 8,
              "whiten_rank": 4, "sample_steps": 2,
              # its samplers on 4 draws (prior.bench.samples < prior.heldout_sequences)
              "bench": {"samples": 4, "new_tokens": 4, "eval_steps": [2], "repeats": 1,
                        "pca_dims": 2}},
    "samples": {"max_new_tokens": 8},
    "study": {"d_model": 16, "n_heads": 2, "n_latent": 1, "seq_len": 32, "steps": 4,
              "batch_size": 4, "warmup_steps": 1, "inner_steps": 1, "encoder_curve": [0, 1],
              "cold_curve": [0, 1], "curve_sequences": 4, "dynamic_lrs": [0.1],
              "val_sequences": 8},
    "ablate": {"steps": 3, "repeats": 2, "warmup": 1, "switches": ["train.opt.fused_loss=true"]},
    "benchmark": {"mixers": {"seq_len": 24, "repeats": 1},
                  "generate": {"prompt_len": 4, "new_tokens": 4, "repeats": 1},
                  "kernels": {"shapes": [[1, 20, 1, 16]], "naive_tokens": 8, "ops": ["delta_rule"],
                              "warmup_ms": 1, "rep_ms": 1}},
    # the recall task at its smallest (the default trains 15 models for minutes)
    "recall": {"mixers": ["attention", "attention:window"], "steps": 2, "batch": 2,
               "seq_len": 16, "window": 2, "n_pairs": 2, "n_keys": 4, "n_values": 4,
               "eval_sequences": 4, "d_model": 8, "n_layers": 1, "n_heads": 2, "seeds": 2},
}
STAGES = ("tokenize", "train", "ablate", "benchmark", "study", "recall", "report")


def _merge(base: dict, changes: dict) -> dict:
    for key, value in changes.items():
        base[key] = _merge(base.get(key) or {}, value) if isinstance(value, dict) else value
    return base


def _run(args: list[str], cwd: Path) -> str:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def workbook(tmp_path_factory):
    if shutil.which("git") is None:
        pytest.skip("git is needed for dvc")
    clone = tmp_path_factory.mktemp("workbook")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        # the pipeline's outputs stay behind (the GPU records under records/ are the report's
        # inputs and come along)
        outputs = name.startswith(("reports/", "data/"))
        if (ROOT / name).is_file() and not outputs:
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, clone / name)
    params = _merge(yaml.safe_load((clone / "params.yaml").read_text()), TINY)
    (clone / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    corpus = clone / "data" / "raw" / "tiny"
    corpus.mkdir(parents=True)
    rng = np.random.default_rng()
    words = "to be or not that is the question whether tis nobler in mind".split()
    for i in range(5):
        (corpus / f"play{i}.txt").write_text(" ".join(rng.choice(words, size=2500)))
    _run(["git", "init", "-q"], clone)
    first = _run(["dvc", "repro"], clone)
    return clone, first


def test_every_stage_ran_and_wrote_its_outputs(workbook):
    clone, log = workbook
    for stage in STAGES:
        assert f"Running stage '{stage}'" in log
        assert (clone / "reports" / "notebooks" / f"{stage}.ipynb").is_file()
    train = json.loads((clone / "reports/results/train.json").read_text())
    assert train["steps"] == 12 and np.isfinite(train["val_loss"])
    # the headline metrics (what `dvc metrics diff` compares) name the plain model's NLL as one
    headline = json.loads((clone / "reports/metrics/train.json").read_text())
    assert headline["lm"]["val_nll"] == round(train["val_loss"], 4)
    assert (clone / "reports/plots/train_loss.csv").read_text().startswith("step,seconds,loss")
    assert (clone / "reports/plots/val_loss.csv").read_text().startswith("step,seconds,loss")
    study = json.loads((clone / "reports/results/study.json").read_text())
    assert set(study["sources"]) == {"testbed", "corpus"} and len(study["verdict"]) == 10
    assert set(json.loads((clone / "reports/metrics/study.json").read_text())) == {"testbed", "corpus"}
    recall = json.loads((clone / "reports/metrics/recall.json").read_text())
    assert set(recall["recall_beyond_window"]) == {"attention", "attention:window"}
    page = (clone / "reports/report.html").read_text()
    assert page.count("data:image/png;base64,") >= 3
    assert study["verdict"][0] in page  # the headline box leads with it


def test_stage_notebooks_show_their_figures(workbook):
    clone, _ = workbook
    for stage in ("train", "ablate", "benchmark", "study", "recall", "report"):
        cells = nbformat.read(clone / "reports" / "notebooks" / f"{stage}.ipynb", as_version=4).cells
        outputs = [out for cell in cells for out in cell.get("outputs", [])]
        assert any("image/png" in out.get("data", {}) for out in outputs), stage


def test_a_stage_notebook_runs_from_the_notebooks_folder_as_in_jupyterlab(workbook, tmp_path):
    # JupyterLab starts the kernel where the notebook lies; the page goes to tmp_path so that
    # DVC's outputs stay as the pipeline left them
    clone, _ = workbook
    page = tmp_path / "report.html"
    run_notebook(clone / "notebooks" / "report.py", tmp_path / "report.ipynb", {"output": str(page)},
                 cwd=clone / "notebooks", echo=False)
    assert page.read_text().count("data:image/png;base64,") >= 3


def test_second_repro_does_nothing(workbook):
    clone, _ = workbook
    log = _run(["dvc", "repro"], clone)
    assert "Running stage" not in log
    assert "up to date" in _run(["dvc", "status"], clone)


def test_changing_a_train_param_reruns_train_ablate_and_the_report_only(workbook):
    # `dvc exp run -S train.lr=...`: not the tokenize, study or recall stage, whose models never
    # read the trained model, and not the benchmark stage, which reads no checkpoint (the prior it
    # once measured is measured in the train stage). tests/test_dvc_deps.py checks statically that
    # each stage's params hold every section its code reads (a `model` change reruns the benchmark)
    clone, _ = workbook
    before = json.loads((clone / "reports/results/train.json").read_text())
    params = yaml.safe_load((clone / "params.yaml").read_text())
    # half of whatever the workspace holds: a value `dvc exp run -S` left there is changed too
    params["train"]["lr"] = params["train"]["lr"] / 2
    (clone / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    log = _run(["dvc", "repro"], clone)
    ran = {stage for stage in STAGES if f"Running stage '{stage}'" in log}
    assert ran == {"train", "ablate", "report"}, ran
    # quiet: summary lines, no progress-bar updates, profiler, kernel-transport or DVC noise
    for noise in ("USDT", "profiler_start", "without encryption", "it/s]", "is empty"):
        assert noise not in log, noise
    assert len(log.splitlines()) <= 40, log
    train = json.loads((clone / "reports/results/train.json").read_text())
    # retrained at the new lr, not resumed from the old checkpoint
    assert np.isfinite(train["val_loss"]) and train["val_loss"] != before["val_loss"]
    # the prior is trained again on the new latent model's posteriors, and measured again
    assert json.loads((clone / "reports/metrics/train.json").read_text())["prior"]


def test_changing_a_study_param_reruns_the_study_and_the_report_only(workbook):
    clone, _ = workbook
    params = yaml.safe_load((clone / "params.yaml").read_text())
    params["study"]["steps"] = params["study"]["steps"] + 1
    (clone / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    log = _run(["dvc", "repro"], clone)
    ran = {stage for stage in STAGES if f"Running stage '{stage}'" in log}
    assert ran == {"study", "report"}, ran
