import pytest
import torch
import torch.nn.functional as F

from ltm.model.cross_entropy import fused_row_nll
from ltm.latent.posterior import frozen
from ltm.model.cross_entropy import IGNORE_INDEX

# float32 on the CPU: the fused path sums the same terms in other chunks; 1e-5 relative
TOLERANCE = 1e-5


def reference(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(hidden @ weight.t(), targets, ignore_index=IGNORE_INDEX,
                           reduction="none")


def inputs(rows: int, dim: int, vocab: int, seed: int) -> tuple:
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, dim, generator=generator)
    weight = torch.randn(vocab, dim, generator=generator) / dim ** 0.5
    targets = torch.randint(vocab, (rows,), generator=generator)
    targets[::4] = IGNORE_INDEX  # some rows left out
    return hidden, weight, targets


@pytest.mark.parametrize("rows,dim,vocab,chunk_rows", [(37, 13, 29, 5), (64, 8, 7, 64),
                                                       (5, 3, 101, None), (11, 16, 33, 1)])
def test_forward_and_backward_match_the_logits_path(rows, dim, vocab, chunk_rows):
    hidden, weight, targets = inputs(rows, dim, vocab, seed=rows)
    upstream = torch.randn(rows, generator=torch.Generator().manual_seed(1))
    h_ref = hidden.clone().requires_grad_()
    expected = reference(h_ref, weight, targets)
    (expected * upstream).sum().backward()
    h = hidden.clone().requires_grad_()
    got = fused_row_nll(h, weight, targets, chunk_rows)
    (got * upstream).sum().backward()
    assert torch.allclose(got, expected, rtol=TOLERANCE, atol=TOLERANCE)
    assert (got[::4] == 0).all()
    error = (h.grad - h_ref.grad).abs().max() / h_ref.grad.abs().max()
    assert error < TOLERANCE, f"relative error of d/dhidden {error:.2e}"


def test_without_gradient_it_only_scores():
    hidden, weight, targets = inputs(9, 4, 6, seed=0)
    with torch.no_grad():
        got = fused_row_nll(hidden, weight, targets, 2)
    assert torch.allclose(got, reference(hidden, weight, targets), rtol=TOLERANCE, atol=TOLERANCE)


def test_a_head_that_trains_is_refused():
    hidden, weight, targets = inputs(4, 3, 5, seed=0)
    with pytest.raises(ValueError, match="must be frozen"):
        fused_row_nll(hidden, weight.requires_grad_(), targets)


def test_frozen_restores_requires_grad_even_after_an_error():
    trained, fixed = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    fixed.requires_grad_(False)
    with pytest.raises(RuntimeError):
        with frozen([trained, fixed]):
            assert not trained.requires_grad
            raise RuntimeError("boom")
    assert trained.requires_grad and not fixed.requires_grad
