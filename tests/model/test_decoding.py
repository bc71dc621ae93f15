"""ltm.model.decoding: the static-cache decoder against LTM.generate (float32, same tokens), ragged
batches against each prompt alone, the compiled step, sampling as tensor ops, one-line errors."""
from __future__ import annotations

import pytest
import torch

from ltm.model.decoding import Decoder, GenerationError, Sampling, generate_tokens
from ltm.model.lm import sample

from tiny_models import MIXERS, VOCAB, tiny


@pytest.mark.parametrize("kernel", ["naive", "torch"])
@pytest.mark.parametrize("name", MIXERS)
def test_static_decoder_gives_the_reference_tokens(name, kernel):
    model = tiny(MIXERS[name], kernel=kernel)
    idx = torch.randint(0, VOCAB, (3, 5), generator=torch.Generator().manual_seed(1))
    want = model.generate(idx, max_new_tokens=12, temperature=0)[:, 5:]
    got = generate_tokens(model, list(idx), 12, Sampling(temperature=0))
    assert torch.equal(got, want)


@pytest.mark.parametrize("name", ["attention", "deltanet"])
def test_static_decoder_with_latents(name):
    model = tiny(MIXERS[name], n_latent=2)
    idx = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(2))
    z = torch.randn(2, 2 * 2, 24, generator=torch.Generator().manual_seed(3))
    want = model.generate(idx, z=z, max_new_tokens=8, temperature=0)[:, 4:]
    assert torch.equal(generate_tokens(model, list(idx), 8, Sampling(0), z=z), want)


@pytest.mark.parametrize("name", MIXERS)
def test_ragged_batch_decodes_as_each_prompt_alone(name):
    model = tiny(MIXERS[name])
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen) for n in (3, 9, 1, 9, 5)]
    alone = torch.cat([model.generate(p[None], max_new_tokens=10, temperature=0)[:, len(p):]
                       for p in prompts])
    assert torch.equal(generate_tokens(model, prompts, 10, Sampling(0)), alone)


@pytest.mark.parametrize("name", ["rwkv7", "attention"])
def test_sampled_tokens_match_the_reference_under_one_seed(name):
    model = tiny(MIXERS[name])
    idx = torch.randint(0, VOCAB, (4, 3), generator=torch.Generator().manual_seed(5))
    torch.manual_seed(6)
    want = model.generate(idx, max_new_tokens=10, temperature=0.9, top_k=20, top_p=0.9)[:, 3:]
    torch.manual_seed(6)
    got = generate_tokens(model, list(idx), 10, Sampling(0.9, 20, 0.9))
    assert torch.equal(got, want)


def test_a_decoder_is_reusable_and_streams_in_chunks():
    model = tiny(MIXERS["deltanet"])
    decoder = Decoder(model, batch=2, length=20, sampling=Sampling(0))
    prompts = [torch.tensor([1, 2, 3]), torch.tensor([4, 5])]
    first = decoder.generate(prompts, 15)
    chunks = []
    again = decoder.generate(prompts, 15, on_tokens=chunks.append, every=4)
    assert torch.equal(first, again)
    assert [c.shape[1] for c in chunks] == [4, 4, 4, 3]
    assert torch.equal(torch.cat(chunks, dim=1), first)
    # returning True from on_tokens stops at that chunk
    assert decoder.generate(prompts, 15, on_tokens=lambda c: True, every=4).shape == (2, 4)
    assert decoder.cache_bytes() > 0
    with pytest.raises(GenerationError, match="overrun the cache of 20"):
        decoder.generate(prompts, 19)


def test_kv_cache_grows_with_length_and_recurrent_state_does_not():
    sizes = {name: [Decoder(tiny(MIXERS[name]), 1, n, graph=False).cache_bytes() for n in (8, 40)]
             for name in ("attention", "deltanet")}
    # 2 layers x (keys, values) x 2 heads x 12 dims x 4 bytes per position
    assert sizes["attention"][1] - sizes["attention"][0] == (40 - 8) * 2 * 2 * 2 * 12 * 4
    assert sizes["deltanet"][1] == sizes["deltanet"][0]


def test_compiled_step_gives_the_reference_tokens():
    # one mixer, one layer: compiling takes most of a minute on two CPU cores
    model = tiny(MIXERS["attention-window"], n_layers=1)
    idx = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(7))
    want = model.generate(idx, max_new_tokens=6, temperature=0)[:, 5:]
    assert torch.equal(generate_tokens(model, list(idx), 6, Sampling(0), compile=True), want)


def test_top_p_and_top_k_keep_only_the_likely_tokens():
    logits = torch.tensor([[0.6, 0.3, 0.1], [0.4, 0.35, 0.25]]).log().repeat(500, 1)
    gen = torch.Generator().manual_seed(8)
    drawn = sample(logits, 1.0, None, gen, top_p=0.5)[:, 0]
    assert set(drawn[0::2].tolist()) == {0}  # 0.6 alone reaches 0.5
    assert set(drawn[1::2].tolist()) == {0, 1}  # 0.4 + 0.35 reach it
    assert set(sample(logits, 1.0, 2, gen)[:, 0].tolist()) == {0, 1}
    assert torch.equal(sample(logits, 1.0, 1, gen), sample(logits, 0.0))
    # the exponential race draws token i with probability p_i
    counts = torch.bincount(sample(logits[:1].repeat(20000, 1), 1.0, None, gen)[:, 0], minlength=3)
    assert torch.allclose(counts / 20000, torch.tensor([0.6, 0.3, 0.1]), atol=0.02)


def test_bad_sampling_and_too_long_prompts_are_one_line_errors():
    with pytest.raises(GenerationError, match="top_p in"):
        Sampling(1.0, None, 1.5)
    model = tiny(MIXERS["rwkv7"])
    with pytest.raises(GenerationError, match="longer than the model's context of 48 tokens"):
        generate_tokens(model, [list(range(30)) * 2], 1)
    with pytest.raises(GenerationError, match="ask for at most 9 new tokens"):
        generate_tokens(model, [list(range(30)) + list(range(10))], 10)
