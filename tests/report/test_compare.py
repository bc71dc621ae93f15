import subprocess

import pandas as pd
import pytest

from ltm.report.compare import changed_params, flatten, is_change, metrics_at, summary_table


def test_a_change_beyond_the_noise_is_marked_better_or_worse():
    now = {"train.json": {"lm": {"val_nll": 3.0, "val_nll_noise": 0.01, "tokens_per_s": 90.0,
                                 "tokens_per_s_noise": 1.0}}}
    then = {"train.json": {"lm": {"val_nll": 3.1, "val_nll_noise": 0.01, "tokens_per_s": 100.0,
                                  "tokens_per_s_noise": 1.0}}}
    close = {"train.json": {"lm": {"val_nll": 3.02, "val_nll_noise": 0.01}}}
    table = summary_table(now, {"a": then, "b": close})
    verdicts = {(r["metric"].split(" ")[0], r["compared with"]): r["verdict"]
                for r in table.to_dict("records")}
    assert verdicts[("validation", "a")] == "better" and verdicts[("training", "a")] == "worse"
    assert verdicts[("validation", "b")] == "within noise"
    assert verdicts[("training", "b")] == "not measured then"


def test_tokens_per_s_measured_beside_other_models_is_not_compared_with_one_measured_alone():
    def run(tokens, at_once=None):
        lm = {"tokens_per_s": tokens, "tokens_per_s_noise": 1.0}
        return {"train.json": {"lm": lm if at_once is None else dict(lm, models_at_once=at_once)}}

    # a run from before the stamp trained its models in turn: missing reads as 1
    table = summary_table(run(50.0, 2), {"old": run(100.0), "alike": run(60.0, 2),
                                         "alone": run(100.0, 1)})
    verdicts = dict(zip(table["compared with"], table["verdict"]))
    assert verdicts["old"] == verdicts["alone"] == "not compared: models_at_once 2 here, 1 then"
    assert verdicts["alike"] == "worse"
    assert pd.isna(table.set_index("compared with").loc["old", "change"])
    assert summary_table(run(90.0, 1), {"old": run(100.0)})["verdict"].tolist() == ["worse"]


def test_a_bound_is_never_compared_with_an_nll():
    """A latent run's bound and a plain run's NLL have different names: no row pairs them."""
    latent = {"train.json": {"lm": {"val_nll_bound": 20.0, "val_nll_bound_noise": 0.1}}}
    plain = {"train.json": {"lm": {"val_nll": 5.5, "val_nll_noise": 0.01}}}
    table = summary_table(latent, {"last commit": plain})
    assert not table["metric"].str.startswith("validation NLL (").any()
    assert (table["then"].isna() | (table["then"] != 5.5)).all()


@pytest.mark.parametrize("delta, noise, expected", [
    (0.1, [0.01, 0.01], True), (0.02, [0.01, 0.01], False), (0.1, [None, 0.01], None)])
def test_is_change_uses_twice_the_combined_noise(delta, noise, expected):
    assert is_change(delta, noise) is expected


def test_metrics_and_params_at_a_commit(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "train.json").write_text('{"val_loss": 2.5}')
    (tmp_path / "params.yaml").write_text("train: {lr: 0.1, opt: {amp: fp16}}\n")
    for args in (["init", "-q"], ["add", "."],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", *args], check=True, capture_output=True)
    (tmp_path / "m" / "train.json").write_text('{"val_loss": 2.0}')
    (tmp_path / "params.yaml").write_text("train: {lr: 0.1, opt: {amp: bf16}}\n")
    assert metrics_at("HEAD", tmp_path / "m")["train.json"]["val_loss"] == 2.5
    assert metrics_at(None, tmp_path / "m")["train.json"]["val_loss"] == 2.0
    assert changed_params(tmp_path / "params.yaml").to_dict("records") == [
        {"parameter": "train.opt.amp", "HEAD": "fp16", "this run": "bf16"}]


def test_flatten_names_nested_keys_with_dots():
    assert flatten({"a": {"b": 1, "c": {"d": 2}}, "e": 3}) == {"a.b": 1, "a.c.d": 2, "e": 3}


def test_the_study_and_recall_verdicts_are_compared_with_their_standard_errors():
    def run(corpus, corpus_se, margin, margin_se):
        return {"study.json": {"corpus": {"latent_gain_over_plain": corpus,
                                          "latent_gain_over_plain_noise": corpus_se}},
                "recall.json": {"recall_margin_over_sliding_window": {"titans:window": {
                    "difference": margin, "difference_noise": margin_se}}}}

    # the corpus gain moved by 0.020, within 2 x hypot(0.018, 0.010); the margin by 0.040, beyond
    then = {"last commit": run(-0.070, 0.018, 0.048, 0.013)}
    table = summary_table(run(-0.090, 0.010, 0.088, 0.012), then)
    verdicts = dict(zip(table["metric"], table["verdict"]))
    assert verdicts == {"study, corpus: latent gain over plain (nats/token)": "within noise",
                        "recall: Titans margin over sliding window": "better"}
    worse = summary_table(run(-0.300, 0.010, 0.048, 0.013), then)
    assert dict(zip(worse["metric"], worse["verdict"]))[
        "study, corpus: latent gain over plain (nats/token)"] == "worse"
