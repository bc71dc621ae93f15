"""ltm.train.float8: which linears float8 training converts, per group, and its device check."""
import importlib.util

import pytest
import torch
from torch import nn

from ltm.model.lm import LTM, ModelConfig
from ltm.params import ParamsError
from ltm.train.float8 import convert_fp8, fp8_filter, fp8_ready
from ltm.train.settings import FP8_CHOICES

def tiny_model(n_latent: int = 0) -> LTM:
    torch.manual_seed(0)
    return LTM(ModelConfig(vocab_size=64, n_layers=2, d_model=32, n_heads=2, max_seq_len=16,
                           n_latent=n_latent))


def test_fp8_converts_the_block_linears_not_the_head():
    model = tiny_model()
    assert not fp8_filter(model.lm_head, "lm_head")
    assert fp8_filter(model.blocks[0].mlp.gate_up, "blocks.0.mlp.gate_up")
    assert not fp8_filter(nn.Linear(24, 32), "x")  # 24 is not a multiple of 16
    assert not fp8_filter(model.blocks[0].mlp_norm, "blocks.0.mlp_norm")
    if importlib.util.find_spec("torchao") is None:
        pytest.skip("torchao is not installed: the swap itself is not checked")
    names = convert_fp8(model, torch.device("cpu"), check_device=False)
    # per block: the mixer's qkv and out_proj, the MLP's gate_up and out_proj
    assert "lm_head" not in names and len(names) == 2 * 4
    kinds = {type(m).__name__ for n, m in model.named_modules() if n in names}
    assert kinds == {"Float8Linear"} and type(model.lm_head) is nn.Linear
    # the weights keep their names: checkpoints of either kind load into the other
    assert set(model.state_dict()) == set(tiny_model().state_dict())


def test_fp8_groups_pick_the_mlps_the_blocks_or_everything():
    model = tiny_model()
    names = {which: [n for n, m in model.named_modules() if fp8_filter(m, n, which)]
             for which in FP8_CHOICES}
    assert names["mlp"] == [f"blocks.{i}.mlp.{p}" for i in range(2) for p in ("gate_up", "out_proj")]
    assert set(names["mlp"]) < set(names["blocks"]) and "lm_head" not in names["blocks"]
    assert names["all"] == names["blocks"] + ["lm_head"]
    with pytest.raises(ValueError, match="fp8 group 'head'"):
        fp8_filter(model.lm_head, "lm_head", "head")
    if importlib.util.find_spec("torchao") is None:
        pytest.skip("torchao is not installed: the swap itself is not checked")
    assert convert_fp8(model, torch.device("cpu"), "all", check_device=False) == names["all"]
    # the float8 head still reads the embedding table: one tensor, as before the swap
    assert type(model.lm_head).__name__ == "Float8Linear"
    assert model.lm_head.weight is model.embed.weight


def test_fp8_needs_a_recent_gpu():
    assert "CUDA GPU" in fp8_ready(torch.device("cpu"))
    with pytest.raises(ParamsError, match=r"^train.opt.fp8: needs a CUDA GPU"):
        convert_fp8(tiny_model(), torch.device("cpu"))
