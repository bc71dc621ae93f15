"""Each-choice selection of parametrized tests, for `make test-newest`: of every test function's
cases, few (greedily: the first, then the one adding the most values) that still run every
value of every one of its parametrize lists at least once. Every kernel, dtype, launch and shape
a test names then runs on the newest torch/Triton pair, which is what that suite is for (an API a
release removed fails every case that reaches it), while the cross products of those values run
once, in the main suite on the pinned pair."""
from __future__ import annotations

import os

ENV = "LTM_TEST_EACH_CHOICE"


def _argnames(marker) -> tuple[str, ...]:
    names = marker.args[0] if marker.args else marker.kwargs["argnames"]
    return tuple(n.strip() for n in names.split(",")) if isinstance(names, str) else tuple(names)


def _choices(item) -> set[tuple]:
    """The values this item takes, one per parametrize list (its argnames' values together) and
    per parametrized fixture."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return set()
    params, choices, named = callspec.params, set(), set()
    for marker in item.iter_markers("parametrize"):
        names = tuple(n for n in _argnames(marker) if n in params)
        named.update(names)
        choices.add((names, tuple(repr(params[n]) for n in names)))
    choices |= {((name,), (repr(value),)) for name, value in params.items() if name not in named}
    return choices


def each_choice(items: list) -> tuple[list, list]:
    """(kept, dropped), each in collection order: per test function, greedily the item that runs
    the most values no kept item of that function has run yet, until every value has run."""
    by_function: dict[str, list] = {}
    for item in items:
        by_function.setdefault(item.nodeid.split("[", 1)[0], []).append(item)
    keep: set[int] = set()
    for cases in by_function.values():
        choices = [_choices(item) for item in cases]
        missing = set().union(*choices)
        keep.add(id(cases[0]))
        missing -= choices[0]
        while missing:
            best = max(range(len(cases)), key=lambda i: len(choices[i] & missing))
            keep.add(id(cases[best]))
            missing -= choices[best]
    kept = [item for item in items if id(item) in keep]
    return kept, [item for item in items if id(item) not in keep]


def select(config, items: list) -> None:
    """Drop, in place, what each_choice drops when the environment asks for it."""
    if os.environ.get(ENV) != "1":
        return
    kept, dropped = each_choice(items)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
