"""ltm.device: a section's `device` setting, one resolver for every stage."""
import pytest
import torch

from ltm.device import device_name, resolve_device
from ltm.params import ParamsError


def test_auto_takes_cuda_only_where_there_is_one():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto", "study.device").type == expected
    assert resolve_device("cpu", "study.device") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_cuda_without_one_is_one_line_naming_the_setting(name):
    with pytest.raises(ParamsError, match=rf"^recall.device: {name} asked for, but torch sees no CUDA device$"):
        resolve_device(name, "recall.device")


def test_device_name_is_the_gpus_or_cpu():
    assert device_name(torch.device("cpu")) == "cpu"
    if torch.cuda.is_available():
        assert device_name(torch.device("cuda")) == torch.cuda.get_device_name(0)
