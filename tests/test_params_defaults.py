"""One owner for each default: params.yaml and the dataclass of its section agree on every value,
so that a key left out of a user's params file means what params.yaml says it means."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from ltm.ablation.switches import AblateConfig
from ltm.bench.recall import RecallBench
from ltm.stages.benchmark import BenchmarkConfig
from ltm.data.cache import DataConfig
from ltm.model.lm import ModelConfig
from ltm.stages.prior import PriorSection
from ltm.stages.report import ReportConfig
from ltm.generate import SamplesConfig
from ltm.study.settings import StudyConfig
from ltm.train.settings import TrainConfig

PARAMS = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
SECTIONS = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig, "prior": PriorSection, "study": StudyConfig,
            "samples": SamplesConfig,
            "ablate": AblateConfig,
            "report": ReportConfig, "benchmark": BenchmarkConfig, "recall": RecallBench}


def _same_sequence(a, b) -> bool:
    # YAML reads a tuple default as a list
    return isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and list(a) == list(b)


def disagreements(cls: type, values: dict, where: str) -> list[str]:
    """'where.key: params.yaml X, dataclass Y' for every default that differs (nested too), and
    every field params.yaml leaves out."""
    found = []
    for f in dataclasses.fields(cls):
        name = f"{where}.{f.name}"
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            continue  # required (a path): params.yaml is its only owner
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        if f.name not in values:
            found.append(f"{name}: missing from params.yaml (dataclass default {default!r})")
        elif dataclasses.is_dataclass(default):
            found += disagreements(type(default), values[f.name] or {}, name)
        elif values[f.name] != default and not _same_sequence(values[f.name], default):
            found.append(f"{name}: params.yaml {values[f.name]!r}, dataclass {default!r}")
    return found


def test_every_section_of_params_yaml_has_a_dataclass():
    assert set(PARAMS) == set(SECTIONS)


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_params_yaml_and_the_dataclass_defaults_agree(section):
    assert disagreements(SECTIONS[section], PARAMS[section], section) == []


def test_a_disagreement_is_found():
    @dataclasses.dataclass
    class Inner:
        a: int = 1

    @dataclasses.dataclass
    class Outer:
        x: float = 0.5
        inner: Inner = dataclasses.field(default_factory=Inner)

    assert disagreements(Outer, {"x": 0.5, "inner": {"a": 2}}, "s") == [
        "s.inner.a: params.yaml 2, dataclass 1"]
    assert disagreements(Outer, {"inner": {"a": 1}}, "s") == [
        "s.x: missing from params.yaml (dataclass default 0.5)"]
