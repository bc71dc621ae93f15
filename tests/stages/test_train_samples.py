import json

import pytest

from ltm.train import checkpoint as ckpt
from ltm.model.lm import LTM, ModelConfig
from ltm.params import ParamsError, to_dict
from ltm.stages.train import samples_stage
from ltm.data.tokenizer import save_tokenizer, train_tokenizer


@pytest.fixture
def run(tmp_path):
    tokenizer = train_tokenizer(["to be or not to be, that is the question"] * 20, 280)
    (tmp_path / "cache").mkdir()
    save_tokenizer(tokenizer, tmp_path / "cache" / "tokenizer.json")
    cfg = ModelConfig(vocab_size=tokenizer.get_vocab_size(), d_model=32, max_seq_len=64)
    ckpt.save_checkpoint(tmp_path / "ckpt" / ckpt.CHECKPOINT_FILE,
                         {"model": LTM(cfg).state_dict(), "model_cfg": to_dict(cfg)})
    return tmp_path


def test_samples_are_written_with_their_settings(run):
    params = run / "params.yaml"
    params.write_text(f"data: {{cache_dir: {run / 'cache'}}}\n"
                      "samples: {prompts: ['to be', 'the'], max_new_tokens: 5, seed: 3}\n")
    table = samples_stage(params, run / "ckpt", run / "out" / "samples.json")
    saved = json.loads((run / "out" / "samples.json").read_text())
    assert table.prompt.tolist() == ["to be", "the"] and saved["samples"] == table.to_dict("records")
    assert all(t.startswith(p) and len(t) > len(p) for p, t in zip(table.prompt, table.text))
    assert saved["settings"]["seed"] == 3 and saved["settings"]["max_new_tokens"] == 5
    # the same seed, the same text
    assert samples_stage(params, run / "ckpt", run / "again.json").equals(table)


def test_a_bad_setting_is_one_line(run):
    params = run / "params.yaml"
    params.write_text(f"data: {{cache_dir: {run / 'cache'}}}\nsamples: {{max_new_tokens: 0}}\n")
    with pytest.raises(ParamsError, match=r"^samples.max_new_tokens: must be >= 1, got 0$"):
        samples_stage(params, run / "ckpt", run / "s.json")


def test_samples_fit_a_small_context(run):
    """The model's context is 64 tokens: 200 new tokens are cut to what fits, not an error."""
    params = run / "params.yaml"
    params.write_text(f"data: {{cache_dir: {run / 'cache'}}}\n"
                      "samples: {prompts: ['to be or not'], max_new_tokens: 200}\n")
    samples_stage(params, run / "ckpt", run / "s.json")
    settings = json.loads((run / "s.json").read_text())["settings"]
    assert settings["max_new_tokens"] == 200 and 1 <= settings["new_tokens_sampled"] < 64
