"""ltm.report.headline: the first screen's four lines, from what the stages wrote, or why not."""
import json

import pandas as pd

from ltm.report.headline import changed_line, headline, kernels_line, latent_line, switches_line


def test_each_line_says_why_it_is_empty(tmp_path):
    lines = headline(tmp_path, tmp_path / "bench", pd.DataFrame())
    assert lines[0].startswith("Latent thoughts: no study")
    assert lines[1] == "Speed switches: the ablate stage wrote no verdicts."
    assert lines[2].startswith("Kernels: no kernel-grid record")
    assert lines[3].startswith("What changed: nothing to compare")


def test_the_latent_line_takes_the_parameter_matched_and_shuffled_controls(tmp_path):
    verdict = ["testbed: latent beats the plain model with as many parameters (equal tokens) by 0.3",
               "testbed: latent beats one learned z shared by all sequences by 0.3",
               "testbed: latent beats z of another sequence by 0.6"]
    (tmp_path / "study.json").write_text(json.dumps({"enabled": True, "verdict": verdict}))
    line = latent_line(tmp_path)
    assert "as many parameters" in line and "another sequence" in line and "shared" not in line


def test_switches_are_grouped_by_verdict_with_the_speed_up_of_a_pass(tmp_path):
    ablate = {"baseline": {"verdict": "BASELINE", "speedup": 1.0},
              "a=1": {"verdict": "PASS", "speedup": 1.234}, "b=2": {"verdict": "FAIL", "speedup": 0.9},
              "c=3": {"verdict": "NO EFFECT", "speedup": 1.0}, "protocol": {"device": "cpu"}}
    (tmp_path / "ablate.json").write_text(json.dumps(ablate))
    assert switches_line(tmp_path) == ("Speed switches (cpu, step-time speed-up of each kept change): "
                                       "PASS a=1 x1.23; FAIL b=2; NO EFFECT c=3.")


def test_what_changed_counts_only_moves_beyond_the_noise():
    table = pd.DataFrame([{"metric": "val", "compared with": "last commit", "verdict": "worse"},
                          {"metric": "tok/s", "compared with": "last commit", "verdict": "within noise"},
                          {"metric": "val", "compared with": "exp a", "verdict": "better"}])
    assert changed_line(table) == "What changed: against last commit: val worse; against exp a: val better."
    calm = table.assign(verdict="within noise")
    assert changed_line(calm) == ("What changed: against last commit: none of 2 headline metrics "
                                  "beyond their noise; against exp a: none of 1 headline metrics "
                                  "beyond their noise.")
    unlike = pd.concat([calm, pd.DataFrame([{
        "metric": "training tokens/s", "compared with": "last commit",
        "verdict": "not compared: models_at_once 2 here, 1 then"}])], ignore_index=True)
    assert changed_line(unlike).startswith(
        "What changed: against last commit: none of 2 headline metrics beyond their noise; "
        "training tokens/s not compared: models_at_once 2 here, 1 then; against exp a")
    only_exp = table[table["compared with"] == "exp a"]
    assert changed_line(only_exp).startswith("What changed: the last commit has no metrics")


def test_the_kernel_line_names_the_reference_it_was_measured_against(tmp_path):
    from pathlib import Path
    assert "no kernel-grid record" in kernels_line(tmp_path)
    records = Path(__file__).resolve().parents[2] / "records" / "bench"
    line = kernels_line(records)
    assert "fla's Triton path" in line and "delta_rule fwd" in line and "worst" in line
    assert "Against fla as installed with FlashQLA" in line and "gated_delta_rule fwd+bwd worst" in line
    (tmp_path / "grid.json").write_text((records / sorted(p.name for p in records.glob("kernel-grid-part1*.json"))[-1]).read_text())
    assert "Not yet against fla with its FlashQLA" in kernels_line(tmp_path)

