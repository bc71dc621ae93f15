"""ltm.ablation.latent_score: the latent model's ablate score is the NLL given a seeded prior draw,
the same every time and moved by a weight's rounding only by rounding."""
import torch

from ltm.ablation.latent_score import prior_nll_sums
from ltm.latent.posterior import latent_shape, sequence_nll
from ltm.model.config import ModelConfig
from ltm.model.lm import LTM


def tiny_model(n_latent: int = 2) -> LTM:
    torch.manual_seed(0)
    return LTM(ModelConfig(vocab_size=16, n_layers=1, d_model=32, n_heads=2, max_seq_len=32,
                           n_latent=n_latent))


def topic_batch(batch: int, seq_len: int, generator: torch.Generator) -> tuple:
    tokens = torch.randint(16, (batch, seq_len + 1), generator=generator)
    return tokens[:, :-1], tokens[:, 1:]


def test_the_prior_score_is_the_nll_given_a_seeded_prior_draw_and_smooth_in_the_weights():
    model = tiny_model(n_latent=2)
    x, y = topic_batch(3, 12, torch.Generator().manual_seed(0))
    sums = prior_nll_sums(model, x, y, seed=5)
    z = torch.randn(latent_shape(model.cfg, 3), generator=torch.Generator().manual_seed(5))
    assert sums[1] == y.numel()
    torch.testing.assert_close(sums[0], sequence_nll(model, z, x, y).double().sum())
    assert torch.equal(prior_nll_sums(model, x, y, seed=5), sums)  # the same draw every time
    # one float32 rounding step of every weight moves it by rounding only
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + torch.finfo(torch.float32).eps)
    moved = prior_nll_sums(model, x, y, seed=5)
    assert abs(float(moved[0] - sums[0])) < 1e-4 * float(sums[0])
