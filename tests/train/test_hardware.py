import pytest
import torch
from torch import nn

from ltm.train.hardware import autocast, find_batch_size, peak_flops, peak_memory, setup_distributed
from ltm.params import ParamsError


def test_autocast_picks_the_asked_dtype():
    x = torch.randn(4, 4)
    with autocast(torch.device("cpu"), "bf16"):
        assert (x @ x).dtype == torch.bfloat16
    with autocast(torch.device("cpu"), "off"):
        assert (x @ x).dtype == torch.float32


def test_cpu_has_no_mfu_peak_and_reports_its_memory():
    assert peak_flops(torch.device("cpu"), "bf16") is None
    mib, kind = peak_memory(torch.device("cpu"))
    assert mib > 10 and kind == "cpu process peak RSS"


def test_batch_size_probe_falls_back_on_the_cpu():
    said = []
    size = find_batch_size(nn.Linear(2, 2), 8, 10, "off", 0.5, torch.device("cpu"), said.append)
    assert size == 16 and "not probed on the CPU" in said[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_one_process_on_the_cpu_and_a_clear_error_without_cuda(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert setup_distributed("auto") == (torch.device("cpu"), 0, 1)
    with pytest.raises(ParamsError, match="train.device: cuda asked for, but torch sees no CUDA"):
        setup_distributed("cuda")


class _Configured(nn.Module):
    """One code object, a configuration per instance (as the ablate stage's model variants)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def forward(self, x):
        return x * len(self.name)


def _compiled_configurations(count: int) -> int:
    """How many of `count` configurations dynamo compiled (the rest ran eagerly)."""
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    for i in range(count):
        torch.compile(_Configured("x" * (i + 1)), backend=backend)(torch.ones(2))
    torch._dynamo.reset()
    return len(graphs)


def test_allow_recompiles_keeps_every_configuration_compiled():
    from ltm.train.hardware import allow_recompiles
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    # dynamo's own patch (restored on exit; monkeypatch's undo deleted the option)
    with config.patch({name: 8}):
        # dynamo's default: past 8 configurations of one code object the rest run eagerly
        assert _compiled_configurations(12) == 8
        allow_recompiles()
        assert getattr(config, name) >= 64
        assert _compiled_configurations(12) == 12
