"""The fused convolution + SiLU + L2 norm against ShortConv and F.normalize, in float64."""
import pytest
import torch
import torch.nn.functional as F

from kernels_helpers import DEVICE, ON_GPU, fresh_seed, rel_err
from ltm.kernels.short_conv import TOKENS, short_conv_silu_norm
from ltm.mixers import ShortConv

# (B, T, heads, head_dim, normalised heads, taps): T = 1, T < TOKENS, odd T over several blocks,
# a head_dim that is no power of two
CASES = [(1, 1, 3, 16, 2, 4), (2, TOKENS - 3, 3, 32, 2, 4), (1, 2 * TOKENS + 7, 4, 24, 2, 3),
         (2, 70, 6, 16, 0, 2)]
if ON_GPU:
    CASES += [(4, 2048, 36, 64, 24, 4), (2, 1000, 6, 128, 4, 4)]
# float32 kernels against the float64 reference: (outputs, gradients); half-precision inputs
# round the outputs and gradients to 8 (bf16) or 11 (fp16) bits
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (5e-3, 1e-2), torch.float16: (1e-3, 2e-3)}
DTYPES = (torch.float32, torch.bfloat16, torch.float16) if ON_GPU else (torch.float32,)


def reference(x, weight, norm_channels, head_dim):
    """ShortConv (its weight is (C, 1, W)) then F.normalize per head of the leading channels."""
    conv = ShortConv(x.shape[-1], weight.shape[0]).to(x.dtype)
    conv.weight = torch.nn.Parameter(weight.t()[:, None])
    y, _ = conv(x)
    B, T, C = y.shape
    heads = y.view(B, T, C // head_dim, head_dim)
    n = norm_channels // head_dim
    normed = torch.cat([F.normalize(heads[:, :, :n], dim=-1), heads[:, :, n:]], dim=2)
    return normed.view(B, T, C), conv.weight


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("B,T,heads,D,n_norm,W", CASES,
                         ids=[f"B{c[0]}-T{c[1]}-H{c[2]}-D{c[3]}-N{c[4]}-W{c[5]}" for c in CASES])
def test_forward_and_gradients_match_the_unfused_path(B, T, heads, D, n_norm, W, dtype):
    seed = fresh_seed()
    tol_out, tol_grad = TOLERANCE[dtype]
    gen = torch.Generator().manual_seed(seed)
    C = heads * D
    x = torch.randn(B, T, C, generator=gen).to(dtype).to(DEVICE).requires_grad_()
    weight = (0.5 * torch.randn(W, C, generator=gen)).to(dtype).to(DEVICE).requires_grad_()
    y = short_conv_silu_norm(x, weight, n_norm * D, D)
    x_ref = x.detach().double().requires_grad_()
    y_ref, w_ref = reference(x_ref, weight.detach().double(), n_norm * D, D)
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
    x = torch.zeros(1, 5, 32, device=DEVICE, requires_grad=True)
    weight = torch.ones(4, 32, device=DEVICE, requires_grad=True)
    y = short_conv_silu_norm(x, weight, 16, 16)
    y.sum().backward()
    assert (y == 0).all() and torch.isfinite(x.grad).all() and torch.isfinite(weight.grad).all()


def test_bad_shapes_raise_one_line_errors():
    x = torch.zeros(1, 5, 32)
    with pytest.raises(ValueError, match=r"^x must be \[B, T, C\]"):
        short_conv_silu_norm(x[0], torch.zeros(4, 32), 16, 16)
    with pytest.raises(ValueError, match=r"^weight must be \[W, C\]"):
        short_conv_silu_norm(x, torch.zeros(4, 31), 16, 16)
    with pytest.raises(ValueError, match="must be multiples of head_dim"):
        short_conv_silu_norm(x, torch.zeros(4, 32), 8, 12)
