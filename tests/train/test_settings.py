"""ltm.train.settings: the `train` section's checks (one-line errors), the switches decided per
device, the learning-rate schedule."""
import pytest
import torch

from ltm.params import ParamsError, from_mapping
from ltm.train.optimizers import lr_factor
from ltm.train.settings import OptConfig, resolve_switches, TrainConfig


def test_config_errors_are_one_line():
    with pytest.raises(ParamsError, match=r"^train.opt.amp: expected 'auto' or 'off'"):
        from_mapping(TrainConfig, {"opt": {"amp": "fp8"}}, "train")
    with pytest.raises(ParamsError, match=r"^train.stepz: unknown parameter \(did you mean 'steps'"):
        from_mapping(TrainConfig, {"stepz": 3}, "train")
    with pytest.raises(ParamsError, match=r"^train.batch_size: expected int or 'auto'"):
        from_mapping(TrainConfig, {"batch_size": "big"}, "train")
    with pytest.raises(ParamsError, match=r"^train.min_lr: must be in"):
        from_mapping(TrainConfig, {"lr": 1e-3, "min_lr": 1e-2}, "train")
    assert from_mapping(TrainConfig, {"batch_size": "auto", "opt": {"tf32": True}}, "train").opt.tf32


def test_auto_switches_are_off_on_the_cpu_and_on_for_cuda():
    cpu = resolve_switches(OptConfig(), torch.device("cpu"))
    assert (cpu.amp, cpu.compile, cpu.fused_loss, cpu.pin_memory) == ("off", False, False, False)
    cuda = resolve_switches(OptConfig(pin_memory=True), torch.device("cuda"))
    assert (cuda.amp, cuda.tf32, cuda.compile, cuda.fused_adamw, cuda.pin_memory) == \
        ("bf16", True, True, True, True)
    # measured slower on a GPU: opt-in only
    assert not cuda.fused_loss
    assert not resolve_switches(OptConfig(pin_memory=True), torch.device("cpu")).pin_memory


def test_lr_warms_up_linearly_then_decays_to_min_lr():
    cfg = TrainConfig(steps=100, warmup_steps=10, lr=1.0, min_lr=0.1)
    factors = [lr_factor(step, cfg) for step in range(101)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert factors[10] == pytest.approx(1.0) and factors[100] == pytest.approx(0.1)
    assert factors[55] == pytest.approx(0.55)
    assert all(a >= b for a, b in zip(factors[10:], factors[11:]))


def test_new_switches_are_off_by_default_and_checked():
    cpu = resolve_switches(OptConfig(), torch.device("cpu"))
    assert (cpu.compile_mode, cpu.fp8, cpu.fused_ops) == ("default", "off", ())
    # true is the block linears (as before the groups existed), a group name that group
    for given, group in [(True, "blocks"), (False, "off"), ("mlp", "mlp"), ("all", "all")]:
        opt = from_mapping(TrainConfig, {"opt": {"fp8": given}}, "train").opt
        assert resolve_switches(opt, torch.device("cpu")).fp8 == group
    with pytest.raises(ParamsError, match=r"^train.opt.fp8: .*'mlp'"):
        from_mapping(TrainConfig, {"opt": {"fp8": "head"}}, "train")
    cfg = TrainConfig()
    assert (cfg.optimizer, cfg.target_loss) == ("adamw", None)
    with pytest.raises(ParamsError, match=r"^train.opt.fused_ops: unknown \['layernorm'\]"):
        from_mapping(TrainConfig, {"opt": {"fused_ops": ["layernorm"]}}, "train")
    with pytest.raises(ParamsError, match=r"^train.optimizer: expected 'adamw' or 'muon'"):
        from_mapping(TrainConfig, {"optimizer": "lion"}, "train")
    with pytest.raises(ParamsError, match=r"^train.muon_lr: must be > 0"):
        from_mapping(TrainConfig, {"muon_lr": 0}, "train")
    with pytest.raises(ParamsError, match=r"^train.opt.compile_mode: expected"):
        from_mapping(TrainConfig, {"opt": {"compile_mode": "fast"}}, "train")
