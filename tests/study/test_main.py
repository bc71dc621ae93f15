"""python -m ltm.study: the study from a params file, and a bad file in one line."""
import json

import pytest
import yaml

from ltm.study.__main__ import main


def test_a_bad_params_file_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match=r"^error: .*no such parameters file$"):
        main(["--params", str(tmp_path / "missing.yaml")])
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"data": {"cache_dir": "c"}, "study": {"window": 0}}))
    with pytest.raises(SystemExit, match=r"^error: study.window: must be >= 1"):
        main(["--params", str(path)])


def test_the_study_runs_from_its_sections_and_prints_its_verdict(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({
        "data": {"cache_dir": str(tmp_path / "unused"),
                 "synthetic": {"topics": 2, "symbols": 5, "length": 12, "train_sequences": 32,
                               "val_sequences": 6}},
        "study": {"sources": ["testbed"], "d_model": 16, "n_heads": 2, "n_latent": 1, "steps": 4,
                  "batch_size": 4, "warmup_steps": 1, "inner_steps": 1, "val_sequences": 6,
                  "encoder_curve": [0], "cold_curve": [0], "curve_sequences": 2,
                  "dynamic_lrs": [0.1], "device": "cpu"}}))
    out = tmp_path / "study.json"
    main(["--params", str(path), "--out", str(out), "--no-progress"])
    printed = capsys.readouterr().out.strip().splitlines()
    verdict = json.loads(out.read_text())["verdict"]
    assert printed[-len(verdict):] == verdict and verdict[0].startswith("testbed:")
