from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from ltm import params as ltm_params
from ltm.params import (ParamsError, apply_override, check, from_mapping, load_section,
                        read_params)


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

    from ltm.data.cache import DataConfig
    root = Path(__file__).resolve().parents[1]
    assert load_section(DataConfig, "data", root / "params.yaml").vocab_size >= 257


@pytest.mark.parametrize("text, value", [("1e-3", 1e-3), ("3.0e-4", 3e-4), ("1E5", 1e5),
                                         ("-2e+2", -200.0), ("0.5", 0.5), ("7", 7.0)])
def test_floats_in_every_form_yaml_1_2_writes_are_numbers(tmp_path, text, value):
    # `dvc exp run -S train.lr=1e-3` writes `lr: 1e-3`, which DVC reads as a number and YAML 1.1
    # (PyYAML) as text: in a file, in a --set override and in a mapping read elsewhere
    path = tmp_path / "params.yaml"
    path.write_text(f"train:\n  lr: {text}\n")
    assert load_section(Outer, "train", path).lr == value
    params = {}
    apply_override(params, f"train.lr={text}")
    assert from_mapping(Outer, params["train"], "train").lr == value
    if "e" in text.lower():
        # the text YAML 1.1 leaves it as, in a mapping that plain yaml.safe_load read
        assert from_mapping(Outer, {"lr": text}, "train").lr == value


def test_integers_stay_strict():
    with pytest.raises(ParamsError, match=r"^train.steps: expected int, got 1000.0$"):
        from_mapping(Outer, read_yaml_value("1e3"), "train")
    with pytest.raises(ParamsError, match=r"^train.steps: expected int, got '1e3'$"):
        from_mapping(Outer, {"steps": "1e3"}, "train")
    with pytest.raises(ParamsError, match=r"^train.lr: expected float, got 'fast'$"):
        from_mapping(Outer, {"lr": "fast"}, "train")


def read_yaml_value(text: str) -> dict:
    params = {}
    apply_override(params, f"train.steps={text}")
    return params["train"]


def test_unknown_sections_are_errors_with_a_suggestion(tmp_path):
    with pytest.raises(ParamsError) as err:
        apply_override({}, "trian.lr=1", "--set")
    assert str(err.value) == "--set: unknown section 'trian' in 'trian.lr=1' (did you mean 'train'?)"
    path = tmp_path / "params.yaml"
    path.write_text("modle:\n  d_model: 64\ntrain:\n  steps: 3\n")
    with pytest.raises(ParamsError) as err:
        read_params(path)
    assert str(err.value) == f"{path}: unknown section 'modle' (did you mean 'model'?)"
    # every section of the repository's params.yaml is known
    assert set(read_params(Path(__file__).resolve().parents[1] / "params.yaml")) <= set(ltm_params.SECTIONS)
