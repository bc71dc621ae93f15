"""ltm.report.study: the study's tables and figure from its metrics."""
from ltm.report.study import (bound_figure, encoder_table, inner_lr_sentence, inner_lr_table,
                              published_table, study_table, verdict_lines)

SOURCE = {
    "suffix_nll": {"latent": {"mean": 3.1, "se": 0.01}, "plain": {"mean": 3.3, "se": 0.01},
                   "exact": {"mean": 2.76, "se": 0.01}},
    "gain_over": {"plain": {"mean": 0.2, "se": 0.008, "z": 25.0, "sequences": 8}},
    "gap_to_exact": {"latent": {"mean": 0.34, "se": 0.01}, "plain": {"mean": 0.54, "se": 0.01}},
    "params": {"latent": 100, "plain": 104},
    "curves": [{"init": i, "steps": n, "bound": 3.5 - 0.01 * n, "nll": 3.2, "kl": 0.3 - 0.01 * n,
                "ms_per_sequence": n} for i in ("encoder", "authors", "prior") for n in (0, 4, 16)],
    "encoder_buys": {"steps": 2, "bound": 3.4, "ms_per_sequence": 2.0,
                     "authors": {"steps_to_match": 16, "ms_per_sequence": 16.0},
                     "prior": {"steps_to_match": None, "best_bound": 3.45}},
    "sequences": 8,
    "published_beside_ours": {
        "sequences": 4, "steps": 2, "published_bound": {"mean": 3.30, "se": 0.02},
        "honest_bound": {"mean": 3.34, "se": 0.02}, "iwae_64": {"mean": 3.32, "se": 0.02},
        "suffix_given_prefix": {"mean": 3.1, "se": 0.01},
        "optimism": {"mean": 0.04, "se": 0.005, "z": 8.0, "sequences": 4}},
}
STUDY = {"enabled": True, "sources": {"testbed": SOURCE}, "verdict": ["testbed: latent beats"]}


def test_the_tables_carry_each_model_with_its_noise():
    table = study_table(STUDY)
    assert list(table["model"])[:2] == ["latent (encoder + k steps)", "plain, as many parameters"]
    plain = table.iloc[1]
    assert plain["suffix NLL"] == "3.300 ± 0.010" and plain["latent's gain"] == "+0.200 ± 0.008 (25 SE)"
    assert plain["gap to exact"] == "+0.540 ± 0.010" and table.iloc[2]["latent's gain"] == ""
    enc = encoder_table(STUDY)
    assert list(enc["cold steps to match"]) == [16, "none (best 3.450)"]


def test_the_verdict_and_figure_or_why_there_are_none():
    assert verdict_lines(STUDY) == ["testbed: latent beats"]
    assert verdict_lines({"enabled": False}) == ["latent study: off (study.enabled false)"]
    assert bound_figure(STUDY) is not None and bound_figure({"enabled": False}) is None


def test_the_bound_figure_says_which_lines_run_off_its_scale():
    import copy
    study = copy.deepcopy(STUDY)
    figure = bound_figure(study)
    assert not [t for ax in figure.axes for t in ax.texts]  # every bound within 1 nat of the NLL
    for row in study["sources"]["testbed"]["curves"]:
        if row["init"] == "authors" and row["steps"] < 16:
            row["bound"] = 13.96 - row["steps"]
    [text] = [t.get_text() for ax in bound_figure(study).axes for t in ax.texts]
    assert text == "authors: bound up to 13.96 above the scale (at 0, 4 steps)"


def test_the_section_leads_with_the_verdict_or_says_why_there_is_none(tmp_path):
    import json
    from ltm.report.study_sections import study_section
    assert "no study.json" in study_section(tmp_path).note
    (tmp_path / "study.json").write_text(json.dumps(STUDY))
    section = study_section(tmp_path)
    assert section.note.startswith("Suffix NLL: the second half") and len(section.tables) == 2
    assert "optimism +0.040 ± 0.005" in section.note
    assert len(section.figures) == 1


def test_a_recorded_gpu_study_is_a_folded_section_of_its_own(tmp_path):
    import json
    from ltm.report.study_sections import recorded_study_section, study_section
    records = tmp_path / "records"
    records.mkdir()
    assert "No GPU study records" in recorded_study_section(records).note
    speed = [{"init": "encoder", "inner_steps": 2, "case": "latent step", "ms": 150.0, "x_plain": 4.2}]
    (records / "study-x.json").write_text(json.dumps({"device": "H100", "commit": "abc",
                                                      "study": STUDY, "speed": speed}))
    section = recorded_study_section(records)
    assert section.folded and "H100" in section.note and "study-x.json" in section.note
    assert len(section.tables) == 3 and section.tables[2]["x_plain"].iloc[0] == 4.2
    assert section.tables[0]["recorded"].iloc[0] == "study-x"
    # this run's section holds this run's study only
    assert study_section(tmp_path).note.startswith("No latent study in this run")
    (records / "study-y.json").write_text(json.dumps({"device": "H200", "study": STUDY, "speed": []}))
    assert len(recorded_study_section(records).tables) == 5  # no empty speed table
    (records / "broken.json").write_text("{}")
    import pytest
    with pytest.raises(ValueError, match="not a GPU study record"):
        recorded_study_section(records)


def test_the_published_bound_stands_beside_the_honest_numbers():
    table = published_table(STUDY)
    assert list(table["nats/token"]) == ["3.300 ± 0.020", "3.340 ± 0.020", "3.320 ± 0.020",
                                         "3.100 ± 0.010", "+0.040 ± 0.005"]
    assert list(table["sequences"]) == [4, 4, 4, 8, 4]
    assert published_table({"sources": {"corpus": {}}}).empty


def test_the_inner_step_size_table_and_sentence_name_the_choice_and_its_criterion():
    pilots = [{"lr": 0.3, "train_loss": 5.93, "suffix_nll": 6.17},
              {"lr": 0.03, "train_loss": 5.69, "suffix_nll": 5.94}]
    study = {"enabled": True, "sources": {"corpus": {"inner_lr": {"chosen": 0.03, "pilots": pilots}},
                                          "testbed": {}}}
    table = inner_lr_table(study)
    assert list(table["inner lr"]) == [0.3, 0.03] and list(table["chosen"]) == ["", "yes"]
    assert list(table["training loss (chooses)"]) == [5.93, 5.69]
    sentence = inner_lr_sentence(study)
    assert "corpus 0.03 (of 0.3/0.03: training loss 5.930/5.690)" in sentence
    assert "testbed" not in sentence
    # one candidate: nothing was chosen, nothing to say
    single = {"enabled": True, "sources": {"corpus": {"inner_lr": {"chosen": 0.3, "pilots": pilots[:1]}}}}
    assert inner_lr_sentence(single) == "" and len(inner_lr_table(single)) == 1
