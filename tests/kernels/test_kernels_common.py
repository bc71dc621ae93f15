import pytest
import torch
import triton
import triton.language as tl

from kernels_helpers import DEVICE, fresh_seed, rel_err
from ltm.kernels.common import (block_size, check_btd, check_dtype, check_head_dim, check_state,
                                dot_precision, invert_unit_lower, nan_buffer)


def test_block_size_is_a_power_of_two_at_least_16():
    assert [block_size(n) for n in (1, 16, 17, 32, 33, 64, 100, 128)] == [16, 16, 32, 32, 64, 64, 128, 128]


def test_dot_precision_is_float32_level_for_float32_only():
    assert dot_precision(torch.float32) == "tf32x3"
    assert dot_precision(torch.bfloat16) == "tf32"
    assert dot_precision(torch.float16) == "tf32"


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
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(16, 16, generator=gen).tril(-1).to(DEVICE)
    x = torch.full_like(a, float("nan"))
    _invert_kernel[(1,)](a, x, 16)
    ref = torch.linalg.inv(torch.eye(16, device=DEVICE, dtype=torch.float64) + a.double())
    assert rel_err(x, ref) <= 1e-5, f"seed={seed}: rel err {rel_err(x, ref):.2e}"


def test_nan_buffer_is_poisoned_only_when_asked(monkeypatch):
    monkeypatch.setenv("LTM_POISON_BUFFERS", "1")
    assert torch.isnan(nan_buffer((3, 5), torch.float32, torch.device("cpu"))).all()
    monkeypatch.setenv("LTM_POISON_BUFFERS", "0")
    buffer = nan_buffer((3, 5), torch.bfloat16, torch.device("cpu"))
    assert buffer.shape == (3, 5) and buffer.dtype == torch.bfloat16
