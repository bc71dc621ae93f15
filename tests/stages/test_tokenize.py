"""ltm.stages.tokenize: the stage reads its `data` section, builds the cache and writes its
metrics; a bad value is a one-line error."""
import json

import numpy as np
import pytest

from ltm.params import ParamsError
from ltm.stages.tokenize import tokenize_stage


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng()
    words = ["king", "queen", "crown", "sword", "night", "love", "death", "the", "of", "and"]
    for i in range(12):
        text = " ".join(rng.choice(words, size=400 + 37 * i))
        (root / f"doc{i:02d}.txt").write_text(f"Document {i}.\n{text}\n")
    return root


def test_stage_reads_params_and_writes_metrics(corpus_dir, tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(f"data:\n  source: {corpus_dir}\n  vocab_size: 280\n  cache_dir: {tmp_path / 'c'}\n")
    metrics, splits = tokenize_stage(params, tmp_path / "m.json")
    assert json.loads((tmp_path / "m.json").read_text()) == metrics
    assert splits.split.tolist() == ["train", "val"] and splits.tokens.sum() == metrics["tokens"]
    assert metrics["vocab_size"] <= 280
    params.write_text(f"data:\n  val_fraction: 1.5\n  cache_dir: {tmp_path / 'c'}\n")
    with pytest.raises(ParamsError, match="data.val_fraction: must be in"):
        tokenize_stage(params, tmp_path / "m.json")
