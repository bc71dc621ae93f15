"""The fused convolution + SiLU + q, k L2 norm against ShortConv and F.normalize, in float64."""
import pytest
import torch
import torch.nn.functional as F

from reference import DEVICE, ON_GPU, case_seed, rel_err
from ltm.kernels.short_conv import TOKENS, short_conv_qkv
from ltm.model.mixers import ShortConv

# (B, T, heads per q / k / v, head_dim, taps): T = 1, T < TOKENS, odd T over several blocks, a
# head_dim that is no power of two
CASES = [(1, 1, 1, 16, 4), (2, TOKENS - 3, 1, 32, 4), (1, 2 * TOKENS + 7, 2, 24, 3), (2, 70, 3, 16, 2)]
if ON_GPU:
    CASES += [(4, 2048, 12, 64, 4), (2, 1000, 2, 128, 4)]
# float32 kernels against the float64 reference: (outputs, gradients); half-precision inputs
# round the outputs and gradients to 8 (bf16) or 11 (fp16) bits
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (5e-3, 1e-2), torch.float16: (1e-3, 2e-3)}
# bfloat16 on the CPU too: under the interpreter the kernels round to it as the GPU does
DTYPES = (torch.float32, torch.bfloat16, torch.float16) if ON_GPU else (torch.float32, torch.bfloat16)


def reference(x, weight, head_dim):
    """ShortConv (its weight is (C, 1, W)), split in q, k, v, then F.normalize per head of q, k."""
    conv = ShortConv(x.shape[-1], weight.shape[0]).to(x.dtype)
    conv.weight = torch.nn.Parameter(weight.t()[:, None])
    y, _ = conv(x)
    B, T, C = y.shape
    q, k, v = y.view(B, T, 3, C // 3 // head_dim, head_dim).unbind(2)
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    return torch.cat([q, k, v], dim=2).view(B, T, C), conv.weight


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("B,T,heads,D,W", CASES,
                         ids=[f"B{c[0]}-T{c[1]}-H{c[2]}-D{c[3]}-W{c[4]}" for c in CASES])
def test_forward_and_gradients_match_the_unfused_path(B, T, heads, D, W, dtype):
    seed = case_seed()
    tol_out, tol_grad = TOLERANCE[dtype]
    gen = torch.Generator().manual_seed(seed)
    C = 3 * heads * D
    x = torch.randn(B, T, C, generator=gen).to(dtype).to(DEVICE).requires_grad_()
    weight = (0.5 * torch.randn(W, C, generator=gen)).to(dtype).to(DEVICE).requires_grad_()
    q, k, v = short_conv_qkv(x, weight, D)
    assert all(t.is_contiguous() and t.shape == (B, T, C // 3) for t in (q, k, v))
    y = torch.cat([q, k, v], dim=2)
    x_ref = x.detach().double().requires_grad_()
    y_ref, w_ref = reference(x_ref, weight.detach().double(), D)
    assert y.dtype == dtype and torch.isfinite(y).all(), f"seed={seed}: unwritten output"
    assert rel_err(y, y_ref) <= tol_out, f"seed={seed}: y rel err {rel_err(y, y_ref):.2e}"
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed + 1)).to(DEVICE)
    (y.float() * dy).sum().backward()
    (y_ref * dy.double()).sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(weight.grad).all(), f"seed={seed}"
    assert rel_err(x.grad, x_ref.grad) <= tol_grad, f"seed={seed}: dx rel err {rel_err(x.grad, x_ref.grad):.2e}"
    dw_ref = w_ref.grad[:, 0].t()
    assert rel_err(weight.grad, dw_ref) <= tol_grad, f"seed={seed}: dw rel err {rel_err(weight.grad, dw_ref):.2e}"


def test_a_zero_head_stays_zero_and_finite():
    # below eps F.normalize divides by eps: no NaN from 0 / 0, in the output or the gradient
    x = torch.zeros(1, 5, 48, device=DEVICE, requires_grad=True)
    weight = torch.ones(4, 48, device=DEVICE, requires_grad=True)
    q, k, v = short_conv_qkv(x, weight, 16)
    (q.sum() + k.sum()).backward()
    assert all((t == 0).all() for t in (q, k, v))
    assert torch.isfinite(x.grad).all() and torch.isfinite(weight.grad).all()


def test_an_unused_output_gets_a_zero_gradient():
    x = torch.randn(2, 9, 48, device=DEVICE, requires_grad=True)
    weight = torch.randn(4, 48, device=DEVICE, requires_grad=True)
    q, k, v = short_conv_qkv(x, weight, 16)
    v.sum().backward()
    x_ref = x.detach().clone().requires_grad_()
    y_ref, _ = reference(x_ref, weight.detach(), 16)
    y_ref[..., 32:].sum().backward()
    assert rel_err(x.grad, x_ref.grad) <= 1e-5


def test_bad_shapes_raise_one_line_errors():
    x = torch.zeros(1, 5, 48)
    with pytest.raises(ValueError, match=r"^x must be \[B, T, C\]"):
        short_conv_qkv(x[0], torch.zeros(4, 48), 16)
    with pytest.raises(ValueError, match=r"^weight must be \[W, C\]"):
        short_conv_qkv(x, torch.zeros(4, 47), 16)
    with pytest.raises(ValueError, match="must be a multiple of 3 \\* head_dim"):
        short_conv_qkv(x, torch.zeros(4, 48), 12)
