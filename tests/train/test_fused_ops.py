"""ltm.train.fused_ops against the plain PyTorch forms, forward and backward, on odd sizes (under Triton's
interpreter on a CPU). Bound: relative error 1e-5 in float32 (max |a - b| / max |b|)."""
import pytest
import torch
import torch.nn.functional as F

from ltm.model.cross_entropy import linear_cross_entropy
from ltm.train.fused_ops import apply_fused_ops, check_fused_against_references, check_fused_ops, rms_norm, rope, swiglu, swiglu_reference
from ltm.train.settings import FUSED_OPS
from ltm.model.cross_entropy import IGNORE_INDEX
from ltm.model.mixers import apply_rope, rope_tables
from ltm.model.lm import LTM, ModelConfig
from ltm.params import ParamsError

BOUND = 1e-5
# the kernels run natively where there is a GPU, through Triton's interpreter elsewhere
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def grads(fn, *inputs):
    leaves = [t.detach().clone().to(DEVICE).requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    out = out if isinstance(out, tuple) else (out,)
    # torch.randn, not randn_like: randn_like follows the memory layout, which differs between
    # the fused (transposed) outputs and the reference ones
    gen = torch.Generator().manual_seed(1)
    sum((o * torch.randn(o.shape, generator=gen).to(DEVICE)).sum() for o in out).backward()
    return out, [t.grad for t in leaves]


def test_rms_norm_matches_torch():
    torch.manual_seed(0)
    x, w = torch.randn(3, 7, 37), torch.randn(37)
    (y,), gx = grads(lambda a, b: rms_norm(a, b, 1e-6), x, w)
    (ref,), gref = grads(lambda a, b: F.rms_norm(a, (37,), b, 1e-6), x, w)
    assert rel(y, ref) < BOUND
    for a, b in zip(gx, gref):
        assert rel(a, b) < BOUND


def test_swiglu_matches_chunked_silu_times_up():
    torch.manual_seed(0)
    gu = torch.randn(2, 5, 2 * 45)
    (y,), (g,) = grads(swiglu, gu)
    (ref,), (gref,) = grads(swiglu_reference, gu)
    assert y.shape == (2, 5, 45)
    assert rel(y, ref) < BOUND and rel(g, gref) < BOUND


def test_rope_matches_apply_rope():
    torch.manual_seed(0)
    B, H, T, D = 2, 3, 11, 16
    q, k = torch.randn(B, H, T, D), torch.randn(B, H, T, D)
    cos, sin = (t.to(DEVICE) for t in rope_tables(D, 32, 10000.0))
    out, g = grads(lambda a, b: rope(a, b, cos[:T], sin[:T]), q, k)
    ref, gref = grads(lambda a, b: (apply_rope(a, cos[:T], sin[:T]), apply_rope(b, cos[:T], sin[:T])),
                      q, k)
    for a, b in zip(out + tuple(g), ref + tuple(gref)):
        assert rel(a, b) < BOUND


def test_linear_cross_entropy_matches_plain_loss_with_ignored_rows():
    torch.manual_seed(0)
    h, w = torch.randn(13, 24), torch.randn(37, 24) * 0.3
    t = torch.randint(0, 37, (13,))
    t[[2, 7]] = IGNORE_INDEX
    t = t.to(DEVICE)
    (loss,), g = grads(lambda a, b: linear_cross_entropy(a, b, t, IGNORE_INDEX), h, w)
    (ref,), gref = grads(lambda a, b: F.cross_entropy(a @ b.t(), t, ignore_index=IGNORE_INDEX), h, w)
    assert rel(loss, ref) < BOUND
    for a, b in zip(g, gref):
        assert rel(a, b) < BOUND


@pytest.mark.parametrize("ops", [["rms_norm"], ["swiglu"], ["rope"], ["rms_norm", "swiglu", "rope"]])
def test_swapped_model_matches_the_plain_one(ops):
    cfg = ModelConfig(vocab_size=67, n_layers=2, d_model=48, n_heads=3, max_seq_len=32)
    torch.manual_seed(0)
    plain = LTM(cfg).to(DEVICE)
    fused = LTM(cfg).to(DEVICE)
    fused.load_state_dict(plain.state_dict())
    assert apply_fused_ops(fused, ops) > 0
    x = torch.randint(0, 67, (2, 9)).to(DEVICE)
    loss_a, loss_b = plain(x, x)[1], fused(x, x)[1]
    loss_a.backward()
    loss_b.backward()
    assert rel(loss_b, loss_a) < BOUND
    for (name, a), b in zip(plain.named_parameters(), fused.parameters()):
        assert rel(b.grad, a.grad) < 1e-4, name
    # generation keeps the reference path and the same weights
    assert torch.equal(fused.generate(x[:, :3], max_new_tokens=4, temperature=0),
                       plain.generate(x[:, :3], max_new_tokens=4, temperature=0))


def test_unknown_op_is_one_line_error():
    with pytest.raises(ParamsError, match="train.opt.fused_ops: unknown"):
        check_fused_ops(["layer_norm"])
    check_fused_ops(list(FUSED_OPS))


def test_the_gpu_runs_check_of_every_fused_op_passes():
    # what gpu/levers_bench.py --parts kernels runs (bfloat16 too, on a GPU only)
    rows = check_fused_against_references(DEVICE)
    dtypes = ["float32"] + (["bfloat16"] if DEVICE == "cuda" else [])
    assert [(row["dtype"], row["op"]) for row in rows] == [(d, op) for d in dtypes for op in FUSED_OPS]
    assert all(row["bound"] == {"float32": 1e-5, "bfloat16": 2e-2}[row["dtype"]] for row in rows)
    assert all(row["ok"] and row["max_rel_error"] <= row["bound"] for row in rows), rows
