import pytest
import torch
import triton
import triton.language as tl

from reference import DEVICE, case_seed, rel_err
from ltm.kernels.rwkv7 import triton_chunk_rwkv7, triton_fused_recurrent_rwkv7
from ltm.kernels.common import (block_size, check_btd, check_dtype, check_head_dim, check_state,
                                dot, dot_precision, intermediate_dtype, invert_unit_lower,
                                invert_unit_lower_by_squaring, nan_buffer, rounded, seq_tile,
                                seq_tile_t, store_tile)


def test_block_size_is_a_power_of_two_at_least_16():
    assert [block_size(n) for n in (1, 16, 17, 32, 33, 64, 100, 128)] == [16, 16, 32, 32, 64, 64, 128, 128]


def test_dot_precision_is_bf16_for_wide_bf16_heads_else_float32_level():
    assert [dot_precision(torch.float32, k) for k in (32, 128)] == ["tf32x3", "tf32x3"]
    assert [dot_precision(torch.bfloat16, k) for k in (32, 63, 64, 128)] == ["tf32x3", "tf32x3", "bf16", "bf16"]
    assert dot_precision(torch.float16, 128) == "tf32x3"
    assert intermediate_dtype("bf16") == torch.bfloat16 and intermediate_dtype("tf32") == torch.float32


def test_checks_name_the_argument():
    x = torch.zeros(2, 5, 3, 8)
    check_btd("k", x, (2, 5, 3), "K")
    with pytest.raises(ValueError, match=r"^k must be \[B, T, H, K\]"):
        check_btd("k", x, (2, 6, 3), "K")
    with pytest.raises(ValueError, match="^v must be float32, bfloat16 or float16"):
        check_dtype("v", x.double(), torch.float32)
    with pytest.raises(ValueError, match="^beta must have the dtype of the first input"):
        check_dtype("beta", x.half(), torch.float32)
    with pytest.raises(ValueError, match="head size must be in"):
        check_head_dim("v", 256)
    with pytest.raises(ValueError, match=r"^initial_state must be \[B, H, K, V\]"):
        check_state("initial_state", torch.zeros(2, 3, 8, 7), (2, 3, 8, 8))


@triton.jit
def _invert_kernel(a_ptr, x_ptr, BC: tl.constexpr):
    idx = tl.arange(0, BC)
    offsets = idx[:, None] * BC + idx[None, :]
    tl.store(x_ptr + offsets, invert_unit_lower(tl.load(a_ptr + offsets), BC))


def test_invert_unit_lower_matches_torch_inverse():
    seed = case_seed()
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(16, 16, generator=gen).tril(-1).to(DEVICE)
    x = torch.full_like(a, float("nan"))
    _invert_kernel[(1,)](a, x, 16)
    ref = torch.linalg.inv(torch.eye(16, device=DEVICE, dtype=torch.float64) + a.double())
    assert rel_err(x, ref) <= 1e-5, f"seed={seed}: rel err {rel_err(x, ref):.2e}"


@triton.jit
def _squaring_kernel(a_ptr, x_ptr, BC: tl.constexpr):
    idx = tl.arange(0, BC)
    offsets = idx[:, None] * BC + idx[None, :]
    tl.store(x_ptr + offsets, invert_unit_lower_by_squaring(tl.load(a_ptr + offsets), BC, "tf32x3"))


@pytest.mark.parametrize("scale", [0.3, 1.0, 2.0])
def test_invert_unit_lower_by_squaring_matches_torch_inverse(scale):
    # scale 2 gives inverse entries in the thousands: the products must not lose them
    seed = case_seed()
    gen = torch.Generator().manual_seed(seed)
    a = (scale * torch.randn(16, 16, generator=gen)).tril(-1).to(DEVICE)
    x = torch.full_like(a, float("nan"))
    _squaring_kernel[(1,)](a, x, 16)
    ref = torch.linalg.inv(torch.eye(16, device=DEVICE, dtype=torch.float64) + a.double())
    assert rel_err(x, ref) <= 1e-5, f"seed={seed}: rel err {rel_err(x, ref):.2e}"


@triton.jit
def _round_and_dot_kernel(a_ptr, b_ptr, r_ptr, c_ptr, N: tl.constexpr):
    idx = tl.arange(0, N)
    offsets = idx[:, None] * N + idx[None, :]
    a, b = tl.load(a_ptr + offsets), tl.load(b_ptr + offsets)
    tl.store(r_ptr + offsets, rounded(a, r_ptr.dtype.element_ty))
    tl.store(c_ptr + offsets, dot(a, b, "bf16"))


def test_rounded_and_bf16_dot_round_to_nearest_even_like_torch():
    seed = case_seed()
    gen = torch.Generator().manual_seed(seed)
    a, b = (torch.randn(32, 32, generator=gen).to(DEVICE) for _ in range(2))
    r = torch.empty(32, 32, dtype=torch.bfloat16, device=DEVICE)
    c = torch.full_like(a, float("nan"))
    _round_and_dot_kernel[(1,)](a, b, r, c, 32)
    assert torch.equal(r, a.to(torch.bfloat16)), f"seed={seed}"
    # exact products of the rounded operands, summed in float32
    ref = a.to(torch.bfloat16).double() @ b.to(torch.bfloat16).double()
    assert rel_err(c, ref) <= 1e-6, f"seed={seed}: rel err {rel_err(c, ref):.2e}"


@triton.jit
def _tf32_dot_kernel(a_ptr, b_ptr, c_ptr, N: tl.constexpr):
    idx = tl.arange(0, N)
    offsets = idx[:, None] * N + idx[None, :]
    tl.store(c_ptr + offsets, dot(tl.load(a_ptr + offsets), tl.load(b_ptr + offsets), "tf32"))


def test_tf32_dot_rounds_its_operands_as_the_tensor_cores_do():
    # tf32 keeps 10 mantissa bits: products of 32 random terms come out ~1e-3 off the exact
    # ones, not float32's ~1e-7; under the interpreter, exactly the truncated operands' product
    seed = case_seed()
    gen = torch.Generator().manual_seed(seed)
    a, b = (torch.randn(32, 32, generator=gen).to(DEVICE) for _ in range(2))
    c = torch.full_like(a, float("nan"))
    _tf32_dot_kernel[(1,)](a, b, c, 32)
    err = rel_err(c, a.double() @ b.double())
    assert 1e-4 < err < 3e-3, f"seed={seed}: rel err {err:.2e}"
    if DEVICE.type == "cpu":
        def truncated(x):
            return (x.view(torch.int32) & -8192).view(torch.float32).double()
        assert rel_err(c, truncated(a) @ truncated(b)) <= 1e-6, f"seed={seed}"


def test_nan_buffer_is_poisoned_only_when_asked(monkeypatch):
    monkeypatch.setenv("LTM_POISON_BUFFERS", "1")
    assert torch.isnan(nan_buffer((3, 5), torch.float32, torch.device("cpu"))).all()
    monkeypatch.setenv("LTM_POISON_BUFFERS", "0")
    buffer = nan_buffer((3, 5), torch.bfloat16, torch.device("cpu"))
    assert buffer.shape == (3, 5) and buffer.dtype == torch.bfloat16


@pytest.mark.parametrize("op", [triton_fused_recurrent_rwkv7, triton_chunk_rwkv7], ids=["token-loop", "chunked"])
def test_both_rwkv7_ops_raise_one_line_errors_on_bad_inputs(op):
    # both call check_rwkv7_inputs
    r = torch.zeros(1, 4, 2, 32, device=DEVICE)
    with pytest.raises(ValueError, match=r"^a must be \[B, T, H, K\]"):
        op(r, r, r, r, r[:, :3], r)
    with pytest.raises(ValueError, match=r"^v must be \[B, T, H, V\]"):
        op(r, r, r, r[:, :2], r, r)
    with pytest.raises(ValueError, match="^b must have the dtype of the first input"):
        op(r, r, r, r, r, r.half())
    with pytest.raises(ValueError, match=r"^initial_state must be \[B, H, K, V\]"):
        op(r, r, r, r, r, r, initial_state=torch.zeros(1, 2, 16, 32, device=DEVICE))
    with pytest.raises(ValueError, match=r"^r must hold at least one token"):
        op(*(torch.zeros(1, 0, 2, 32, device=DEVICE) for _ in range(6)))


@triton.jit
def _transposed_tile_kernel(x, out, i_b, i_h, T, H, D: tl.constexpr, row0, col0,
                            BR: tl.constexpr, BD: tl.constexpr):
    # read the (BD, BR) transposed tile, write it back as the (BR, BD) tile it is the transpose of
    ptrs, mask = seq_tile_t(x, i_b, i_h, T, H, D, row0, col0, BR, BD)
    tile_t = tl.load(ptrs, mask=mask, other=0.)
    store_tile(seq_tile(out, i_b, i_h, T, H, D, row0, col0, BR, BD), tl.trans(tile_t))


@pytest.mark.parametrize("B,T,H,D,row0,col0,BR,BD", [
    (2, 37, 3, 32, 16, 0, 32, 32),   # the tile runs past T: masked rows
    (1, 20, 2, 48, 0, 32, 16, 32),   # past D: masked columns
    (1, 16, 1, 16, 0, 0, 16, 16)])
def test_seq_tile_t_reads_the_transpose_of_seq_tile(B, T, H, D, row0, col0, BR, BD):
    x = torch.randn(B, T, H, D, device=DEVICE)
    out = torch.zeros_like(x)
    _transposed_tile_kernel[(1,)](x, out, B - 1, H - 1, T, H, D, row0, col0, BR, BD)
    expect = torch.zeros_like(x)
    rows, cols = slice(row0, min(row0 + BR, T)), slice(col0, min(col0 + BD, D))
    expect[B - 1, rows, H - 1, cols] = x[B - 1, rows, H - 1, cols]
    torch.testing.assert_close(out, expect, rtol=0, atol=0)
