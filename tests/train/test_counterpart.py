"""ltm.train.counterpart: checkpoints of counterparts a configuration does not train are removed;
the train stage compares its model with plain and latent counterparts at equal tokens and FLOPs."""
import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from ltm.params import ParamsError
from ltm.stages.train import train_stage
from ltm.train import checkpoint as ckpt
from ltm.train.settings import TrainConfig
from ltm.train.counterpart import LATENT, PLAIN, PLAIN_FLOPS, SUBFOLDERS, remove_stale_counterparts
from tests.train.trainer_cases import cache_dir, one_thread  # noqa: F401 (fixtures)
from tests.train.trainer_cases import write_params


def test_only_the_counterparts_this_run_does_not_train_are_removed(tmp_path):
    for folder in SUBFOLDERS.values():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "last.pt").write_bytes(b"x")
    (tmp_path / "last.pt").write_bytes(b"main")
    said = []
    removed = remove_stale_counterparts(tmp_path, {PLAIN, PLAIN_FLOPS}, said.append)
    assert removed == [tmp_path / SUBFOLDERS[LATENT]]
    assert (tmp_path / SUBFOLDERS[PLAIN] / "last.pt").is_file()
    assert (tmp_path / SUBFOLDERS[PLAIN_FLOPS] / "last.pt").is_file()
    assert (tmp_path / "last.pt").read_bytes() == b"main"
    assert len(said) == 1 and SUBFOLDERS[LATENT] in said[0]
    # nothing stale: nothing said
    assert remove_stale_counterparts(tmp_path, {PLAIN, PLAIN_FLOPS}, said.append) == []
    assert len(said) == 1


def test_without_counterparts_every_counterpart_folder_goes(tmp_path):
    for folder in SUBFOLDERS.values():
        (tmp_path / folder).mkdir()
    remove_stale_counterparts(tmp_path, set(), lambda *_: None)
    assert not any((tmp_path / folder).exists() for folder in SUBFOLDERS.values())


def counterpart_params(tmp_path: Path, cache_dir: str, n_latent: int = 0, **counterpart) -> Path:
    settings = dict(n_latent=2, latent_steps=1, eval_steps=[0, 2], eval_batches=1,
                    max_equal_flops_steps=100)
    settings.update(counterpart)
    return write_params(tmp_path / "params.yaml", cache_dir,
                        dict(n_layers=1, d_model=32, n_heads=2, max_seq_len=32, n_latent=n_latent),
                        dict(steps=3, batch_size=2, seq_len=16, eval_batches=2, eval_every=100,
                             warmup_steps=1, latent={"steps": 2, "eval_steps": [0, 1]},
                             counterpart=settings))


def test_the_train_stage_compares_plain_and_latent_at_equal_tokens_and_flops(cache_dir, tmp_path,
                                                                             capsys):
    params = counterpart_params(tmp_path, cache_dir)
    out = tmp_path / "out"
    result = train_stage(params, str(tmp_path / "ckpt"), out / "train.json", out / "loss.csv",
                         progress=False)
    saved = json.loads((out / "train.json").read_text())
    assert saved["n_latent"] == 0 and saved["steps"] == 3  # the configured model's metrics
    rows = {r["model"]: r for r in saved["comparison"]}
    assert list(rows) == ["plain", "latent", "plain-equal-flops"]
    plain, latent, flops = rows.values()
    assert [r["kind"] for r in rows.values()] == ["plain", "latent", "plain"]
    assert latent["n_latent"] == 2 and latent["latent_steps"] == 1
    assert plain["tokens"] == latent["tokens"] == 3 * 2 * 16
    assert plain["val_loss_is"] == "NLL" and latent["val_loss_is"] == "NELBO bound"
    # the inner step costs FLOPs: the latent model more than the plain one per token, and the
    # plain model at equal FLOPs the first step count that reaches the latent model's
    assert latent["training_flops"] > plain["training_flops"]
    per_step = plain["training_flops"] / plain["steps"]
    assert flops["steps"] > plain["steps"] and flops["steps"] == saved["equal_flops_steps"]
    assert 0 <= flops["training_flops"] - latent["training_flops"] < per_step
    for row in rows.values():
        assert all(math.isfinite(row[k]) for k in ("val_loss", "val_prefix_nll", "val_prefix_ppl"))
    curves = saved["latent_model"]
    assert set(curves["val_nelbo_by_steps"]) == set(curves["val_prefix_nll_by_steps"]) == {"0", "2"}
    assert "reduced from train.latent.steps 2" in curves["note"]
    assert "the first 1 validation batches" in curves["note"]
    assert set(saved["counterparts"]) == {"latent", "plain-equal-flops"}
    # every model's curves side by side; the stage's own curves stay the configured model's
    table = [line.split(",") for line in (out / "compare_loss.csv").read_text().split()]
    assert table[0] == ["model", "split", "step", "seconds", "loss"]
    assert {(r[0], r[1]) for r in table[1:]} == {(m, s) for m in rows for s in ("train", "val")}
    assert len((out / "loss.csv").read_text().split()) == 4
    assert (tmp_path / "ckpt" / ckpt.CHECKPOINT_FILE).is_file()
    for folder in ("counterpart-latent", "counterpart-plain-equal-flops"):
        assert (tmp_path / "ckpt" / folder / ckpt.CHECKPOINT_FILE).is_file()
    # resumable: a second run trains nothing and reports the same
    capsys.readouterr()
    again = train_stage(params, str(tmp_path / "ckpt"), out / "train.json", out / "loss.csv",
                        progress=False)
    assert capsys.readouterr().out.count("nothing to train") == 3
    assert again.metrics["comparison"] == result.metrics["comparison"]


def test_a_latent_model_is_compared_with_plain_ones_and_the_cap_is_said(cache_dir, tmp_path):
    params = counterpart_params(tmp_path, cache_dir, n_latent=2, max_equal_flops_steps=3)
    out = tmp_path / "out"
    train_stage(params, str(tmp_path / "ckpt"), out / "train.json", out / "loss.csv",
                progress=False)
    saved = json.loads((out / "train.json").read_text())
    rows = saved["comparison"]
    assert [(r["model"], r["role"]) for r in rows] == [
        ("latent", "configured"), ("plain", "counterpart: equal tokens"),
        ("plain-equal-flops", "counterpart: equal FLOPs")]
    assert rows[0]["latent_steps"] == 2 and rows[1]["n_latent"] == 0
    assert rows[2]["skipped"].startswith("skipped: over the cap")
    assert "max_equal_flops_steps is 3" in rows[2]["skipped"]
    # the configured latent model's own curves are its train.latent.eval_steps over all batches
    assert set(saved["val_nelbo_by_steps"]) == {"0", "1"}
    assert set(saved["latent_model"]["val_nelbo_by_steps"]) == {"0", "1"}
    assert not (tmp_path / "ckpt" / "counterpart-plain-equal-flops").exists()


# a small prior (ltm.stages.prior) the train stage trains once its latent model is trained
PRIOR = {"patch": 4, "width": 16, "n_heads": 2, "depth": 1, "steps": 20, "batch_size": 8,
         "train_sequences": 24, "heldout_sequences": 8, "fit_batch": 8, "train_timesteps": 50,
         "sample_steps": 5, "checkpoint_every": 10, "warmup_steps": 2}


def test_models_trained_side_by_side_compare_as_those_trained_in_turn(cache_dir, tmp_path, capsys):
    out = tmp_path / "out"
    compared, priors = {}, {}
    for workers in (1, 2):
        (tmp_path / str(workers)).mkdir()
        params = counterpart_params(tmp_path / str(workers), cache_dir, workers=workers)
        params.write_text(yaml.safe_dump({**yaml.safe_load(params.read_text()), "prior": PRIOR}))
        capsys.readouterr()
        result = train_stage(params, str(tmp_path / str(workers) / "ckpt"), out / "train.json",
                             out / "loss.csv", progress=False,
                             prior_metrics_path=out / f"prior-{workers}.json")
        said = capsys.readouterr().out
        compared[workers] = result.metrics
        # the prior trained on the latent model once it was trained, its lines said here too
        priors[workers] = json.loads((out / f"prior-{workers}.json").read_text())
        assert priors[workers]["latent_model"] == "counterpart-latent"
        assert priors[workers]["steps"] == 20 and said.count("prior: started") == 1
        latent_done = said.index("trained 3 steps in", said.index("counterpart (latent"))
        assert said.index("prior: ") > said.index("val NLL bound")
        assert latent_done < said.index("prior: ")
        # the stage stamps how its tokens/s was measured
        assert result.metrics["models_at_once"] == workers
        assert json.loads((out / "train.json").read_text())["models_at_once"] == workers
        # each worker's summary line reaches this process (and so the notebook), once per model
        assert said.count("trained 3 steps") == 2 and said.count("trained ") == 3
        assert ("at once on 2 processes" in said) == (workers == 2)
    in_turn, side_by_side = compared[1], compared[2]
    assert side_by_side["equal_flops_steps"] == in_turn["equal_flops_steps"] > 3
    for a, b in zip(in_turn["comparison"], side_by_side["comparison"]):
        assert {k: a[k] for k in ("model", "role", "steps", "tokens", "training_flops")} == \
            {k: b[k] for k in ("model", "role", "steps", "tokens", "training_flops")}
        # the same seeds and batches; a worker's thread count may round differently
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-4)
    assert side_by_side["latent_model"]["val_nelbo_by_steps"].keys() == \
        in_turn["latent_model"]["val_nelbo_by_steps"].keys()
    # the same prior, whichever process trained it (up to the rounding of a thread count)
    assert priors[2]["eval_loss_heldout"] == pytest.approx(priors[1]["eval_loss_heldout"], rel=1e-3)
    # resumed in turn, the finished models keep how their own tokens/s was measured
    params = counterpart_params(tmp_path / "2", cache_dir, workers=1)
    again = train_stage(params, str(tmp_path / "2" / "ckpt"), out / "again.json", out / "loss.csv",
                        progress=False)
    assert "nothing to train" in capsys.readouterr().out
    assert again.metrics["models_at_once"] == 2
    assert again.metrics["tokens_per_s"] == side_by_side["tokens_per_s"]
    assert {r["model"]: r["tokens_per_s"] for r in again.metrics["comparison"]} == \
        {r["model"]: r["tokens_per_s"] for r in side_by_side["comparison"]}


def test_models_train_in_turn_on_a_gpu_under_torchrun_and_with_a_found_batch(monkeypatch):
    from ltm.train.counterpart import side_by_side_workers
    from ltm.train.settings import CounterpartConfig

    cpu = TrainConfig(device="cpu", counterpart=CounterpartConfig(workers=2))
    assert side_by_side_workers(cpu) == 2
    assert side_by_side_workers(dataclasses.replace(cpu, counterpart=CounterpartConfig(workers=1))) == 1
    assert side_by_side_workers(dataclasses.replace(cpu, batch_size="auto")) == 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert side_by_side_workers(dataclasses.replace(cpu, device="auto")) == 1
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert side_by_side_workers(cpu) == 1


def test_a_negative_counterpart_workers_is_a_one_line_error():
    from ltm.train.settings import CounterpartConfig

    with pytest.raises(ParamsError, match="workers: must be >= 0, got -1"):
        CounterpartConfig(workers=-1)


def test_counterparts_off_train_the_configured_model_alone(cache_dir, tmp_path):
    params = counterpart_params(tmp_path, cache_dir, enabled=False)
    params.write_text(yaml.safe_dump({**yaml.safe_load(params.read_text()), "prior": PRIOR}))
    out = tmp_path / "out"
    train_stage(params, str(tmp_path / "ckpt"), out / "train.json", out / "loss.csv",
                progress=False, prior_metrics_path=out / "prior.json")
    assert "comparison" not in json.loads((out / "train.json").read_text())
    # no latent model, so no prior: said in its metrics file, which is the stage's output
    assert "trained no latent model" in json.loads((out / "prior.json").read_text())["skipped"]
    assert (out / "compare_loss.csv").read_text().split() == ["model,split,step,seconds,loss"]
    assert [p.name for p in (tmp_path / "ckpt").iterdir() if p.is_dir()] == []
