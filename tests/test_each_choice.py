"""tests/each_choice.py: the newest suite's selection keeps every value of every parametrize list
and parametrized fixture of each test function, and drops only repeats of values already run."""
from types import SimpleNamespace

import pytest

from tests.each_choice import ENV, each_choice, select


def _item(function: str, markers: list[str], **params):
    marks = [pytest.mark.parametrize(names, []).mark for names in markers]
    ident = "-".join(map(str, params.values()))
    return SimpleNamespace(nodeid=f"tests/t.py::{function}[{ident}]" if params else f"tests/t.py::{function}",
                           callspec=SimpleNamespace(params=params) if params else None,
                           iter_markers=lambda name: iter(marks))


def _cross(function: str = "test_a"):
    # kernel x (shape, a two-name list) x dtype, and a parametrized fixture `device`
    return [_item(function, ["kernel", "B,T", "dtype"], kernel=k, B=b, T=t, dtype=d, device="cpu")
            for k in ("prep", "fwd", "bwd") for b, t in ((1, 7), (2, 33)) for d in ("f32", "bf16")]


def test_every_value_runs_once_and_the_cross_product_does_not():
    items = _cross() + [_item("test_plain", [])]
    kept, dropped = each_choice(items)
    assert len(kept) + len(dropped) == len(items) and kept[0] is items[0]
    runs = [item.callspec.params for item in kept if item.callspec]
    assert {r["kernel"] for r in runs} == {"prep", "fwd", "bwd"}
    assert {(r["B"], r["T"]) for r in runs} == {(1, 7), (2, 33)}
    assert {r["dtype"] for r in runs} == {"f32", "bf16"}
    # three kernels need three cases; the shapes and dtypes ride along with them
    assert len(runs) == 3
    assert items[-1] in kept  # an unparametrized test always runs


def test_functions_are_covered_apart_and_the_order_is_kept():
    first, second = _cross("test_a"), _cross("test_b")
    kept, _ = each_choice(first + second)
    assert sum(item in kept for item in second) == 3
    assert kept == sorted(kept, key=(first + second).index)


def test_selection_only_when_the_environment_asks(monkeypatch):
    deselected = []
    config = SimpleNamespace(hook=SimpleNamespace(pytest_deselected=lambda items: deselected.extend(items)))
    items = _cross()
    monkeypatch.delenv(ENV, raising=False)
    select(config, items)
    assert len(items) == 12 and not deselected
    monkeypatch.setenv(ENV, "1")
    select(config, items)
    assert len(items) == 3 and len(deselected) == 9
