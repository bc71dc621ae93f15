"""The training comparison of gpu/auto.sh (ltm/bench/auto_train.py) on the CPU: a tiny model per
kernel through the real build-and-step loop with a fake clock, the row of a kernel that cannot
run, the ratios, the printed table with auto's choices, and the one-line exit without CUDA."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from ltm.bench import auto_train
from ltm.model.lm import LTM, ModelConfig
from ltm.ops import auto

ROOT = auto.TABLE_DIR.parents[2]


def tiny_build(mixer: str, overrides: dict):
    cfg = ModelConfig(vocab_size=17, mixer=mixer, n_layers=1, d_model=16, chunk_size=8,
                      **overrides)
    model = LTM(cfg)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def cpu_step(model, opt, idx):
    _, loss = model(idx, idx)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def test_each_kernel_gets_a_row_and_auto_says_what_it_ran(capsys):
    auto.forget()
    ms = {"torch": 20.0, "auto": 10.0}
    steps = []

    def time_step(fn):  # runs the real step once, then reports its kernel's fake time
        fn()
        steps.append(kernel_now[0])
        return ms[kernel_now[0]]

    kernel_now = [None]

    def build(mixer, overrides):
        kernel_now[0] = overrides["kernel"]
        return tiny_build(mixer, overrides)

    kernels = ["torch", "auto"] + ([] if importlib.util.find_spec("fla") else ["fla"])
    rows = auto_train.measure(kernels, [32, 64], mixer="deltanet", heads=2, time_step=time_step,
                              build=build, step=cpu_step)
    assert [(r["kernel"], r["T"]) for r in rows] == [(k, T) for T in (32, 64) for k in kernels]
    assert steps == ["torch", "auto"] * 2
    by = {(r["kernel"], r["T"]): r for r in rows}
    assert by[("auto", 64)]["B"] == auto_train.TOKENS_PER_STEP // 64
    assert by[("auto", 64)]["tokens_per_s"] == pytest.approx(256 * 64 / 0.01)
    assert by[("auto", 32)]["x_torch"] == pytest.approx(2.0)
    if "fla" in kernels:
        assert by[("fla", 32)]["error"].startswith("ParamsError: model.kernel: 'fla' needs")
    text = auto_train.format_rows(rows, auto.chosen())
    assert "x_torch" in text.splitlines()[0]
    assert "auto: delta_rule training float32 D8 T<=512 BH/SM -: torch (not on CUDA)" in text
    auto.forget()


def test_without_cuda_it_exits_with_one_line():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    done = subprocess.run([sys.executable, "-m", "ltm.bench.auto_train"], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 1 and done.stderr == ("auto_train: needs a CUDA GPU (it times "
                                                    "training steps of the GPU profile)\n")
