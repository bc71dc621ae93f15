"""ltm.stages.tokenize: the stage reads its `data` section, builds the cache and writes its
metrics; a bad value is a one-line error."""
import json

import numpy as np
import pytest

from ltm.data.synthetic import exact_log_likelihoods
from ltm.params import ParamsError
from ltm.stages.tokenize import tokenize_stage
from tiny_corpus import write_documents


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return write_documents(tmp_path_factory.mktemp("corpus"))


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


def test_stage_on_the_synthetic_source_writes_the_exact_entropies(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(f"data:\n  source: synthetic\n  seed: 3\n  cache_dir: {tmp_path / 'c'}\n"
                      "  synthetic: {topics: 4, symbols: 16, length: 32, train_sequences: 100,"
                      " val_sequences: 50}\n")
    metrics, splits = tokenize_stage(params, tmp_path / "m.json")
    written = json.loads((tmp_path / "m.json").read_text())
    assert written == metrics and written["synthetic"]["topics"] == 4 and written["synthetic"]["seed"] == 3
    for key in ("exact_val_entropy", "exact_val_suffix_entropy", "exact_val_topic_entropy"):
        assert 0 < written[key] < np.log(16), key
    exact = exact_log_likelihoods(tmp_path / "c")
    assert written["exact_val_entropy"] == pytest.approx(-exact["log_p"].sum() / (50 * 32))
    assert written["exact_val_suffix_entropy"] == pytest.approx(-exact["log_p_suffix"].sum() / (50 * 16))
    assert splits.documents.tolist() == [100, 50] and written["vocab_size"] == 17
    params.write_text(f"data:\n  source: synthetic\n  cache_dir: {tmp_path / 'c'}\n"
                      "  synthetic: {topic: 4}\n")
    with pytest.raises(ParamsError, match=r"^data.synthetic.topic: unknown parameter \(did you mean"):
        tokenize_stage(params, tmp_path / "m.json")
