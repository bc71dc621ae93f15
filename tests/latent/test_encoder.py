"""ltm.latent.encoder: built only for init encoder, starts at the prior, its NELBO trains it and
nothing else, and after a short training its q beats the prior's with no inner step."""
import pytest
import torch

from ltm.latent.encoder import LatentEncoder, amortised_nelbo, attach_encoder
from ltm.latent.evaluate import fitted_nelbo_sums
from ltm.latent.posterior import (LatentConfig, decoder_fitter, encoder_start, gaussian_kl,
                                  latent_shape, sequence_nll)
from ltm.model.lm import LTM, ModelConfig
from ltm.train.objective import LossModel
from test_posterior import initial_posterior, tiny_model, topic_batch

pytestmark = pytest.mark.usefixtures("one_thread")

ENCODER = LatentConfig(init="encoder", steps=4)


def test_no_encoder_and_no_random_draw_unless_init_is_encoder():
    for init in ("authors", "prior"):
        model = tiny_model()
        keys, state = set(model.state_dict()), torch.get_rng_state()
        attach_encoder(model, LatentConfig(init=init))
        assert model.encoder is None and set(model.state_dict()) == keys
        assert torch.equal(torch.get_rng_state(), state)
    plain = attach_encoder(tiny_model(n_latent=0), ENCODER)
    assert plain.encoder is None


def test_the_encoder_is_part_of_the_model_and_starts_at_the_prior():
    model = tiny_model()
    before = model.num_params()
    attach_encoder(model, ENCODER)
    assert isinstance(model.encoder, LatentEncoder)
    own = sum(p.numel() for p in model.encoder.parameters())
    assert model.num_params() == before + own
    assert any(k.startswith("encoder.") for k in model.state_dict())
    post, shape = initial_posterior("encoder", model)
    assert torch.equal(post.mu, torch.zeros(shape)) and torch.equal(post.log_var, torch.zeros(shape))
    # the encoder reads the sequence: after a nudge of its head, sequences get their own start
    with torch.no_grad():
        model.encoder.head.weight.normal_()
    x, y = topic_batch(2, 8, torch.Generator().manual_seed(0))
    mu, _ = encoder_start(model, (x, y))
    assert mu.shape == latent_shape(model.cfg, 2) and not torch.allclose(mu[0], mu[1])


def test_the_amortised_nelbo_has_the_nelbo_value_and_gradient_and_spares_the_decoder():
    model = attach_encoder(tiny_model(), ENCODER)
    x, y = topic_batch(3, 8, torch.Generator().manual_seed(1))
    shape = latent_shape(model.cfg, 3)
    generator = torch.Generator().manual_seed(2)
    mu = torch.randn(shape, generator=generator).requires_grad_()
    log_var = (torch.randn(shape, generator=generator) - 1).requires_grad_()
    eps = torch.randn(shape, generator=generator)
    got = amortised_nelbo(decoder_fitter(model, ENCODER), (x, y), mu, log_var, eps)
    grads = torch.autograd.grad(got.sum(), [mu, log_var])
    assert all(p.grad is None for p in model.parameters())
    # by hand: the NELBO through the decoder, weights and all
    z = mu + torch.exp(0.5 * log_var) * eps
    want = sequence_nll(model, z, x, y) + gaussian_kl(mu, log_var)
    assert torch.allclose(got, want, rtol=1e-5)
    for a, b in zip(grads, torch.autograd.grad(want.sum(), [mu, log_var])):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def test_the_training_step_trains_the_decoder_as_before_and_the_encoder_on_its_nelbo():
    model = attach_encoder(tiny_model(), ENCODER)
    with torch.no_grad():
        model.encoder.head.weight.normal_(std=0.1)
    loss_model = LossModel(model, fused_loss=False, compile=False, latent=ENCODER)
    x, y = topic_batch(4, 8, torch.Generator().manual_seed(3))
    torch.manual_seed(4)
    loss = loss_model(x, y)
    loss.backward()
    decoder = {n: p.grad.clone() for n, p in model.named_parameters() if not n.startswith("encoder.")}
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.encoder.parameters())
    # the same z again (same seed): the decoder's loss, and its gradients, are the whole story
    model.zero_grad(set_to_none=True)
    torch.manual_seed(4)
    with torch.no_grad():
        start = encoder_start(model, (x, y))
    z = loss_model.fitter.fit((x, y), latent_shape(model.cfg, 4), start=start).sample()
    alone = model(x, y, z=z)[1]
    alone.backward()
    assert float(loss.detach()) == float(alone.detach())
    for name, grad in decoder.items():
        assert torch.allclose(grad, dict(model.named_parameters())[name].grad, atol=1e-7), name


def encoder_bound(model, init: str, batches) -> float:
    """The NELBO per token with q at its start (0 inner steps), 8 samples of z per sequence."""
    fitter = decoder_fitter(model, LatentConfig(init=init))
    sums = sum(fitted_nelbo_sums(model, fitter, x, y, 0, 8, torch.Generator().manual_seed(i))
               for i, (x, y) in enumerate(batches))
    return float((sums[0] + sums[1]) / sums[2])


def shift_batch(batch: int, seq_len: int, generator: torch.Generator) -> tuple:
    """Sequences of one of 4 topics each, topic k stepping k + 1 tokens on (mod 16) from each
    token: unlike topic_batch's, no single token names the topic."""
    topic = torch.randint(4, (batch, 1), generator=generator)
    start = torch.randint(16, (batch, 1), generator=generator)
    tokens = (start + (topic + 1) * torch.arange(seq_len + 1)) % 16  # (batch, seq_len + 1)
    return tokens[:, :-1], tokens[:, 1:]


def train(model: LTM, params, steps: int, seed: int) -> None:
    """`steps` training steps of LossModel (init encoder, 4 inner steps) on shift batches,
    AdamW on `params`."""
    loss_model = LossModel(model, fused_loss=False, compile=False, latent=ENCODER)
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        loss_model(*shift_batch(8, 16, generator)).backward()
        optimizer.step()
        model.zero_grad(set_to_none=True)


def test_the_encoder_trains_and_then_beats_the_prior_without_inner_steps():
    # a decoder that sees one token at a time (window 1) cannot find the topic in the context:
    # only the latent can carry it, worth log 4 nats a token (about 3 s on one core)
    torch.manual_seed(0)
    model = attach_encoder(LTM(ModelConfig(vocab_size=16, n_layers=1, d_model=32, n_heads=2,
                                           max_seq_len=32, n_latent=2, window=1)), ENCODER)
    held_out = [shift_batch(8, 16, torch.Generator().manual_seed(100 + i)) for i in range(2)]
    train(model, model.parameters(), 100, seed=1)  # decoder and encoder: the decoder uses z
    # a fresh encoder on that decoder, trained alone (a decoder still moving makes the encoder's
    # bound noisy at this size): it starts at the prior's bound exactly, then leaves it behind
    model.encoder = None
    attach_encoder(model, ENCODER)
    prior = encoder_bound(model, "prior", held_out)
    assert encoder_bound(model, "encoder", held_out) == prior
    train(model, model.encoder.parameters(), 40, seed=2)
    encoder = encoder_bound(model, "encoder", held_out)
    assert encoder < prior - 1.0, (encoder, prior)
