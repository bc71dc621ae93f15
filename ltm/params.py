"""Strict loading of params.yaml sections into dataclasses.

Every stage reads its section through `load_section`, so an unknown key, a wrong type or a bad
value stops the run with one line that names the key, never with a traceback deep in a stage.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

T = TypeVar("T")


# the sections of params.yaml, one per stage (and model, read by several): any other is a typo
SECTIONS = ("data", "model", "train", "prior", "study", "samples", "ablate", "report", "benchmark",
            "recall")
# floats that YAML 1.2 (DVC's ruamel) reads as numbers and YAML 1.1 (PyYAML) as text: an exponent
# without a dot or without a sign, e.g. 1e-3 or 1.0e5, as `dvc exp run -S train.lr=1e-3` writes
EXPONENT_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)[eE][-+]?[0-9]+")


class ParamsError(ValueError):
    """A params.yaml value is missing, unknown, of the wrong type or out of range."""


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader that also reads YAML 1.2's exponent floats as floats."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(f"^(?:{EXPONENT_FLOAT.pattern})$"),
                              list("-+.0123456789"))


def load_yaml(text: str):
    """Parse YAML as DVC does for numbers: 1e-3 is a float, not the text '1e-3'."""
    return yaml.load(text, Loader=_Loader)


def read_params(path: str | Path = "params.yaml") -> dict:
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"{path}: no such parameters file")
    try:
        data = load_yaml(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ParamsError(f"{path}: top level must be a mapping of sections")
    for section in data:
        if section not in SECTIONS:
            raise ParamsError(f"{path}: unknown section '{section}'{_did_you_mean(section, SECTIONS)}")
    return data


def _did_you_mean(name: Any, choices) -> str:
    close = difflib.get_close_matches(str(name), list(choices), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def load_section(cls: type[T], section: str, path: str | Path = "params.yaml") -> T:
    """Build dataclass `cls` from section `section` of the parameters file."""
    params = read_params(path)
    if section not in params:
        raise ParamsError(f"{path}: section '{section}' is missing")
    return from_mapping(cls, params[section], section)


def from_mapping(cls: type[T], mapping: Any, where: str) -> T:
    """Build dataclass `cls` from `mapping`; `where` names the section in error messages."""
    if mapping is None:
        mapping = {}
    if not isinstance(mapping, dict):
        raise ParamsError(f"{where}: expected a mapping, got {type(mapping).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in mapping:
        if key not in fields:
            raise ParamsError(f"{where}.{key}: unknown parameter{_did_you_mean(key, fields)}")
    hints = typing.get_type_hints(cls)
    values = {name: _convert(mapping[name], hints[name], f"{where}.{name}")
              for name in fields if name in mapping}
    missing = [name for name, f in fields.items() if name not in values
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ParamsError(f"{where}.{missing[0]}: required parameter is missing")
    try:
        return cls(**values)
    except ParamsError as err:
        # raised by `check` in the dataclass's __post_init__ with the field name first
        raise ParamsError(f"{where}.{err}") from None


def to_dict(obj: Any) -> dict:
    """A dataclass as a plain dict (nested dataclasses too), for logging and metrics."""
    return dataclasses.asdict(obj)


def _describe(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if _is_union(tp):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _convert(value: Any, tp: Any, where: str) -> Any:
    """Check `value` against type `tp`; return it (converted where safe, e.g. int -> float)."""
    origin = typing.get_origin(tp)
    if _is_union(tp):
        for option in typing.get_args(tp):
            try:
                return _convert(value, option, where)
            except ParamsError:
                continue
        raise ParamsError(f"{where}: expected {_describe(tp)}, got {value!r}")
    if origin is Literal:
        choices = typing.get_args(tp)
        # YAML 1.1 reads a bare off / on (as `dvc exp run -S train.opt.amp=off` writes it) as a
        # boolean: where "off" or "on" is a choice, that is what was meant
        if isinstance(value, bool) and ("on" if value else "off") in choices:
            return "on" if value else "off"
        if value in choices and type(value) in {type(a) for a in choices}:
            return value
        raise ParamsError(f"{where}: expected {_describe(tp)}, got {value!r}")
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise ParamsError(f"{where}: expected a list, got {value!r}")
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        items = [_convert(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ParamsError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        return from_mapping(tp, value, where)
    return _convert_scalar(value, tp, where)


def _convert_scalar(value: Any, tp: Any, where: str) -> Any:
    if tp is Any:
        return value
    if tp is type(None):
        if value is None:
            return None
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        # a mapping read by plain yaml.safe_load still holds 1e-3 as text
        if isinstance(value, str) and EXPONENT_FLOAT.fullmatch(value.strip()):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        raise TypeError(f"{where}: unsupported parameter type {tp!r}")
    raise ParamsError(f"{where}: expected {_describe(tp)}, got {value!r}")


def check(condition: bool, field: str, message: str) -> None:
    """In a dataclass's `__post_init__`: raise a one-line ParamsError naming `field` unless
    `condition`; `from_mapping` puts the section name in front."""
    if not condition:
        raise ParamsError(f"{field}: {message}")


def apply_override(params: dict, assignment: str, where: str = "override") -> None:
    """Apply 'section.key=value' (value read as YAML) to the nested dict `params`, in place.
    Unknown sections stop here; unknown keys are caught later by `from_mapping`, with the usual
    one-line error."""
    key, sep, value = assignment.partition("=")
    *parents, leaf = key.strip().split(".")
    if not sep or not parents or not all(parents) or not leaf:
        raise ParamsError(f"{where}: '{assignment}' is not of the form section.key=value")
    if parents[0] not in SECTIONS:
        raise ParamsError(f"{where}: unknown section '{parents[0]}' in '{assignment}'"
                          f"{_did_you_mean(parents[0], SECTIONS)}")
    node = params
    for name in parents:
        node = node.setdefault(name, {})
        if not isinstance(node, dict):
            raise ParamsError(f"{where}: '{key}' goes below the plain value of '{name}'")
    try:
        node[leaf] = load_yaml(value)
    except yaml.YAMLError as err:
        raise ParamsError(f"{where}: '{assignment}': the value is not valid YAML "
                          f"({str(err).splitlines()[0]})") from None
