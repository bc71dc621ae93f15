from dataclasses import dataclass, field
from typing import Literal

import pytest

from ltm.params import ParamsError, check, from_mapping, load_section


@dataclass
class Inner:
    amp: Literal["off", "bf16", "fp16"] = "off"
    workers: int = 0


@dataclass
class Outer:
    steps: int = 10
    lr: float = 1e-3
    window: int | None = None
    batch_size: int | Literal["auto"] = 8
    name: str = "x"
    flag: bool = False
    switches: list[str] = field(default_factory=list)
    opt: Inner = field(default_factory=Inner)

    def __post_init__(self) -> None:
        check(self.steps > 0, "steps", f"must be > 0, got {self.steps}")


def test_valid_mapping_converts_and_nests():
    cfg = from_mapping(Outer, {"steps": 3, "lr": 1, "window": 5, "batch_size": "auto",
                               "switches": ["a"], "opt": {"amp": "bf16"}}, "train")
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float)
    assert cfg.window == 5 and cfg.batch_size == "auto" and cfg.opt.amp == "bf16"
    assert cfg.opt.workers == 0 and cfg.switches == ["a"]


@pytest.mark.parametrize("mapping, message", [
    ({"stesp": 3}, "train.stesp: unknown parameter (did you mean 'steps'?)"),
    ({"steps": "3"}, "train.steps: expected int, got '3'"),
    ({"steps": 2.5}, "train.steps: expected int, got 2.5"),
    ({"flag": 1}, "train.flag: expected bool, got 1"),
    ({"steps": True}, "train.steps: expected int, got True"),
    ({"batch_size": "big"}, "train.batch_size: expected int or 'auto', got 'big'"),
    ({"opt": {"amp": "bf17"}}, "train.opt.amp: expected 'off' or 'bf16' or 'fp16', got 'bf17'"),
    # YAML's `on` is a boolean too, but "on" is no choice of amp
    ({"opt": {"amp": True}}, "train.opt.amp: expected 'off' or 'bf16' or 'fp16', got True"),
    ({"opt": {"wrokers": 2}}, "train.opt.wrokers: unknown parameter (did you mean 'workers'?)"),
    ({"switches": "a"}, "train.switches: expected a list, got 'a'"),
    ({"steps": 0}, "train.steps: must be > 0, got 0"),
    ([1, 2], "train: expected a mapping, got list"),
])
def test_bad_values_fail_with_one_line(mapping, message):
    with pytest.raises(ParamsError) as err:
        from_mapping(Outer, mapping, "train")
    assert str(err.value) == message
    assert "\n" not in str(err.value)


def test_a_bare_yaml_off_means_the_choice_off(tmp_path):
    # `dvc exp run -S train.opt.amp=off` writes `amp: off`, which YAML 1.1 reads as False
    path = tmp_path / "params.yaml"
    path.write_text("train:\n  opt:\n    amp: off\n")
    assert load_section(Outer, "train", path).opt.amp == "off"


def test_load_section_reports_missing_file_section_and_bad_yaml(tmp_path):
    with pytest.raises(ParamsError, match="no such parameters file"):
        load_section(Outer, "train", tmp_path / "nope.yaml")
    path = tmp_path / "params.yaml"
    path.write_text("data: {}\n")
    with pytest.raises(ParamsError, match="section 'train' is missing"):
        load_section(Outer, "train", path)
    path.write_text("train: {steps: [\n")
    with pytest.raises(ParamsError, match="not valid YAML"):
        load_section(Outer, "train", path)
    path.write_text("train:\n  steps: 7\n")
    assert load_section(Outer, "train", path).steps == 7


def test_repository_params_file_loads_every_section():
    """params.yaml at the repository root is valid for every stage that reads it."""
    from pathlib import Path

    from ltm.cache import DataConfig
    root = Path(__file__).resolve().parents[1]
    assert load_section(DataConfig, "data", root / "params.yaml").vocab_size >= 257
