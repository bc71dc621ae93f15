"""ltm.generate: quantisation, sampling text from checkpoint files, a latent model's z, and the
command's one-line errors (the decoder itself: tests/test_decoder.py)."""
from __future__ import annotations

import importlib.util
import re

import pytest
import torch

from ltm.train import checkpoint as ckpt
from ltm.model.decoding import GenerationError, Sampling, generate_tokens
from ltm.generate import main, quantization_loss_delta, quantize_model, sample_text
from ltm.model.lm import LTM, ModelConfig
from ltm.params import to_dict
from ltm.data.tokenizer import save_tokenizer, train_tokenizer
from tiny_models import MIXERS, VOCAB, tiny

needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                   reason="torchao is not installed")


@needs_torchao
def test_int8_weights_change_the_loss_little():
    model = tiny(MIXERS["attention"], d_model=64, d_ff=128)
    batches = [(torch.randint(0, VOCAB, (4, 16)), torch.randint(0, VOCAB, (4, 16)))
               for _ in range(2)]
    result = quantization_loss_delta(model, "int8", batches)
    assert result["loss_delta"] != 0 and abs(result["loss_delta"]) < 1e-2 * result["loss"]
    quantized = quantize_model(tiny(MIXERS["deltanet"]), "int8")
    assert generate_tokens(quantized, [[1, 2, 3]], 4, Sampling(0)).shape == (1, 4)
    with pytest.raises(GenerationError, match="int4 weight-only kernel runs on CUDA GPUs only"):
        quantize_model(model, "int4")


@pytest.fixture
def trained_files(tmp_path):
    """A checkpoint in the train stage's format and a token cache folder with its tokenizer."""
    tokenizer = train_tokenizer(["to be or not to be, that is the question"] * 20, 280)
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    save_tokenizer(tokenizer, cache_dir / "tokenizer.json")
    cfg = ModelConfig(vocab_size=tokenizer.get_vocab_size(), mixer="deltanet", d_model=32,
                      max_seq_len=32)
    ckpt.save_checkpoint(tmp_path / "run" / ckpt.CHECKPOINT_FILE,
                         {"model": LTM(cfg).state_dict(), "model_cfg": to_dict(cfg)})
    return tmp_path / "run", cache_dir, tokenizer


def test_the_command_streams_text(trained_files, capsys):
    run, cache_dir, _ = trained_files
    main(["--checkpoint", str(run), "--cache-dir", str(cache_dir), "--prompt", "to be",
          "--max-new-tokens", "6", "--temperature", "0", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert out.startswith("to be") and "tokens/s" in err


def test_sample_text_continues_each_prompt(trained_files):
    run, cache_dir, tokenizer = trained_files
    texts = sample_text(run, cache_dir, ["to be", "the"], max_new_tokens=5, seed=0)
    assert [t[:len(p)] for t, p in zip(texts, ["to be", "the"])] == ["to be", "the"]
    assert sample_text(run, tokenizer, ["to be"], 5, seed=1) == sample_text(run, tokenizer,
                                                                           ["to be"], 5, seed=1)


@pytest.mark.parametrize("case, message", [
    ("missing", r"^error: \S+/nowhere: no checkpoint there \(train one first: dvc repro train\)$"),
    ("long", r"^error: the prompt is \d+ tokens, longer than the model's context of 32 tokens$"),
    ("vocab", r"^error: \S+tokenizer.json: the tokenizer has 280 tokens, the checkpoint's model "
              r"only 270: it was trained on another token cache \(pass its --cache-dir\)$"),
])
def test_the_command_fails_in_one_line(trained_files, case, message):
    run, cache_dir, _ = trained_files
    if case == "vocab":
        cfg = ModelConfig(vocab_size=270, d_model=32, max_seq_len=32)
        ckpt.save_checkpoint(run / ckpt.CHECKPOINT_FILE,
                             {"model": LTM(cfg).state_dict(), "model_cfg": to_dict(cfg)})
    args = ["--checkpoint", str(run.parent / "nowhere" if case == "missing" else run),
            "--cache-dir", str(cache_dir), "--device", "cpu",
            "--prompt", "to be or not " * 20 if case == "long" else "to be"]
    with pytest.raises(SystemExit) as info:
        main(args)
    assert "\n" not in str(info.value)
    assert re.match(message, str(info.value)), str(info.value)


def test_a_latent_model_samples_with_z_from_the_scaled_prior_or_fitted_to_the_prompt():
    from ltm.latent.prior import prompt_latents
    model = tiny(MIXERS["deltanet"], n_latent=2)
    ids = [[1, 2, 3, 4, 5], [6, 7, 8]]
    torch.manual_seed(0)
    prior = prompt_latents(model, ids, 0.5, 0)
    torch.manual_seed(0)
    unit = prompt_latents(model, ids, 1.0, 0)
    assert prior.shape == (2, 2 * 2, 24) and torch.allclose(prior, 0.5 * unit)
    fitted = prompt_latents(model, ids, 1.0, 3)
    assert fitted.shape == prior.shape and torch.isfinite(fitted).all()
    # the fitted z depends on the prompt: the rows of different prompts differ in their means
    assert not torch.allclose(fitted[0], fitted[1])
    assert prompt_latents(tiny(MIXERS["deltanet"]), ids, 1.0, 3) is None
    # and z reaches the tokens: with other latents, other greedy continuations
    a = generate_tokens(model, ids, 6, Sampling(0), z=prior)
    b = generate_tokens(model, ids, 6, Sampling(0), z=-4 * prior)
    assert not torch.equal(a, b)


def test_z_is_fitted_with_the_checkpoints_own_inner_loop_and_the_command_says_where_z_came_from(
        tmp_path, capsys):
    from ltm.latent.posterior import LatentConfig
    from ltm.latent.prior import prompt_latents
    tokenizer = train_tokenizer(["to be or not to be, that is the question"] * 20, 280)
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    save_tokenizer(tokenizer, cache_dir / "tokenizer.json")
    cfg = ModelConfig(vocab_size=tokenizer.get_vocab_size(), mixer="attention", n_heads=2,
                      d_model=32, max_seq_len=32, n_latent=2)
    latent = LatentConfig(steps=3, init="prior", lr=0.05, optimizer="sgd")
    ckpt.save_checkpoint(tmp_path / "run" / ckpt.CHECKPOINT_FILE,
                         {"model": LTM(cfg).state_dict(), "model_cfg": to_dict(cfg),
                          "train_cfg": {"latent": to_dict(latent)}})
    assert ckpt.load_latent_config(tmp_path / "run") == latent
    model = ckpt.load_model(tmp_path / "run")
    ids = [[0, 5, 6, 7, 8]]
    # the checkpoint's loop (sgd from the prior) and the defaults' (adamw from the authors' start)
    torch.manual_seed(0)
    own = prompt_latents(model, ids, 1.0, 3, latent)
    torch.manual_seed(0)
    default = prompt_latents(model, ids, 1.0, 3)
    assert not torch.allclose(own, default)
    args = ["--checkpoint", str(tmp_path / "run"), "--cache-dir", str(cache_dir), "--prompt",
            "to be", "--max-new-tokens", "3", "--device", "cpu"]
    main(args + ["--fit-latents"])
    assert "[z fitted to the prompt: 3 inner steps (sgd, lr 0.05, start prior)" in capsys.readouterr().err
    main(args + ["--fit-latents", "5"])
    assert "5 inner steps" in capsys.readouterr().err
    main(args)
    assert "[z drawn from N(0, I) x 1, the training prior" in capsys.readouterr().err
