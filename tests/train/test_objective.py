import os

import pytest
import torch

from ltm.model.cross_entropy import chunked_cross_entropy, cross_entropy_reference, IGNORE_INDEX


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def make_inputs(seed: int, B: int, T: int, D: int, V: int, dtype=torch.float32, ignored: bool = False):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, D, generator=gen).to(dtype).requires_grad_()
    weight = (torch.randn(V, D, generator=gen) * D ** -0.5).to(dtype).requires_grad_()
    targets = torch.randint(V, (B, T), generator=gen)
    if ignored:
        targets[torch.rand(B, T, generator=gen) < 0.3] = IGNORE_INDEX
    return hidden, weight, targets


def loss_and_grads(loss_fn, hidden, weight, targets, **kwargs):
    h, w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    loss = loss_fn(h, w, targets, **kwargs)
    grad_out = torch.rand(()) + 0.5
    (loss * grad_out).backward()
    return loss.detach(), h.grad, w.grad


# chunk_rows None = the default; 7 does not divide B*T; 1000 > B*T is a single chunk
@pytest.mark.parametrize("B,T,D,V,chunk_rows", [
    (2, 63, 32, 257, None), (3, 17, 24, 1000, 7), (1, 5, 16, 50, 1000), (2, 33, 40, 97, 1)],
    ids=lambda v: str(v))
@pytest.mark.parametrize("ignored", [False, True], ids=["all-targets", "some-ignored"])
def test_matches_cross_entropy_forward_and_backward(B, T, D, V, chunk_rows, ignored):
    seed = int(torch.randint(0, 2**31, (1,)))
    hidden, weight, targets = make_inputs(seed, B, T, D, V, ignored=ignored)
    torch.manual_seed(seed)
    ref = loss_and_grads(cross_entropy_reference, hidden, weight, targets)
    torch.manual_seed(seed)
    out = loss_and_grads(chunked_cross_entropy, hidden, weight, targets, chunk_rows=chunk_rows)
    for name, a, b in zip(("loss", "d hidden", "d weight"), out, ref):
        # float32 throughout; only the summation order differs
        assert rel_err(a, b) < 1e-5, f"{name}: rel err {rel_err(a, b):.2e} (seed {seed})"


# torch.compile is on by default on CUDA: its CPU counterpart runs in CI, not behind a variable
def test_compiled_elementwise_part_matches():
    seed = int(torch.randint(0, 2**31, (1,)))
    hidden, weight, targets = make_inputs(seed, 2, 37, 24, 211, ignored=True)
    torch.manual_seed(seed)
    ref = loss_and_grads(cross_entropy_reference, hidden, weight, targets)
    torch.manual_seed(seed)
    out = loss_and_grads(chunked_cross_entropy, hidden, weight, targets, chunk_rows=16, compile=True)
    for name, a, b in zip(("loss", "d hidden", "d weight"), out, ref):
        assert rel_err(a, b) < 1e-5, f"{name}: rel err {rel_err(a, b):.2e} (seed {seed})"


def test_bfloat16_under_autocast_is_close_to_float32():
    seed = int(torch.randint(0, 2**31, (1,)))
    hidden, weight, targets = make_inputs(seed, 2, 40, 64, 300)
    torch.manual_seed(seed)
    ref = loss_and_grads(cross_entropy_reference, hidden, weight, targets)
    torch.manual_seed(seed)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = loss_and_grads(chunked_cross_entropy, hidden, weight, targets, chunk_rows=16)
    assert out[0].dtype == torch.float32 and out[2].dtype == torch.float32
    for name, a, b in zip(("loss", "d hidden", "d weight"), out, ref):
        # bf16 operands carry 8 bits of mantissa: about 0.4% per element, less in the norm
        assert rel_err(a, b) < 2e-2, f"{name}: rel err {rel_err(a, b):.2e} (seed {seed})"


def test_only_gradients_are_kept_for_backward_never_full_logits():
    B, T, D, V = 2, 64, 16, 512
    hidden, weight, targets = make_inputs(int(torch.randint(0, 2**31, (1,))), B, T, D, V)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        chunked_cross_entropy(hidden, weight, targets, chunk_rows=8).backward()
    assert saved and max(saved) <= max(B * T * D, V * D), f"saved tensors of sizes {saved}"
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        cross_entropy_reference(hidden, weight, targets)
    # the check can fail: the plain loss does keep (N, V) logits
    assert max(saved) >= B * T * V


def test_no_grad_evaluation_returns_the_same_loss():
    hidden, weight, targets = make_inputs(int(torch.randint(0, 2**31, (1,))), 2, 9, 8, 31)
    with torch.no_grad():
        loss = chunked_cross_entropy(hidden, weight, targets, chunk_rows=4)
        ref = cross_entropy_reference(hidden, weight, targets)
    assert rel_err(loss, ref) < 1e-6


@pytest.mark.parametrize("bad,match", [
    (dict(targets=torch.zeros(2, 4, dtype=torch.int64)), "targets: expected shape"),
    (dict(weight=torch.zeros(10, 7)), "weight: expected shape"),
    (dict(targets=torch.zeros(2, 5, dtype=torch.int32)), "targets: expected dtype"),
    (dict(chunk_rows=0), "chunk_rows"),
], ids=["target-shape", "weight-shape", "target-dtype", "chunk-rows"])
def test_bad_input_gives_one_line_error(bad, match):
    args = dict(hidden=torch.zeros(2, 5, 8), weight=torch.zeros(10, 8),
                targets=torch.zeros(2, 5, dtype=torch.int64), chunk_rows=None)
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        chunked_cross_entropy(**args)


def test_loss_model_matches_the_model_loss_with_and_without_the_chunked_loss():
    from ltm.train.objective import LossModel
    from ltm.model.lm import LTM, ModelConfig
    seed = int(torch.randint(0, 2**31, (1,)))
    torch.manual_seed(seed)
    model = LTM(ModelConfig(vocab_size=97, n_layers=1, d_model=32, n_heads=2, max_seq_len=16))
    x, y = torch.randint(97, (2, 13)), torch.randint(97, (2, 13))
    plain = LossModel(model, fused_loss=False, compile=False)(x, y)
    chunked = LossModel(model, fused_loss=True, compile=False)(x, y)
    assert rel_err(chunked, model(x, y)[1]) < 1e-6 and rel_err(plain, model(x, y)[1]) < 1e-6, seed


def test_plain_and_fused_loss_leave_out_the_same_targets():
    """train.opt.fused_loss switches LTM.forward's loss for chunked_cross_entropy: both must leave
    out exactly the targets equal to IGNORE_INDEX (the plain one once ignored -1 instead)."""
    from ltm.model.lm import LTM, ModelConfig
    torch.manual_seed(0)
    model = LTM(ModelConfig(vocab_size=61, n_layers=1, d_model=32, n_heads=2, max_seq_len=16))
    x = torch.randint(61, (3, 13))
    y = torch.randint(61, (3, 13))
    y[:, :5] = IGNORE_INDEX
    plain = model(x, y)[1]
    fused = chunked_cross_entropy(model.hidden(x), model.lm_head.weight, y, chunk_rows=7)
    assert torch.allclose(plain, fused, rtol=1e-5, atol=1e-6)
    logits = model(x)[0][:, 5:]
    direct = torch.nn.functional.cross_entropy(logits.reshape(-1, 61), y[:, 5:].reshape(-1))
    assert torch.allclose(plain, direct, rtol=1e-5, atol=1e-6)
