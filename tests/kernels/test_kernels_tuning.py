"""ltm.kernels.tuning: the autotuned launch path (run here in Triton's interpreter with a host
clock in place of the GPU's timer) gives the reference results, with every configuration of every
tuned kernel's list run first, and in-place kernels restored between the timed runs."""
import time

import pytest
import torch

from reference import DEVICE, assert_matches_reference, case_seed

from ltm.kernels import tuning
from ltm.kernels.delta_rule import launch_choices, triton_chunk_delta_rule
from ltm.kernels.rwkv7 import triton_chunk_rwkv7
from ltm.ops.delta_rule.naive import naive_delta_rule
from ltm.ops.rwkv7.naive import naive_rwkv7

import test_kernels_delta_rule as delta_rule_tests
import test_kernels_rwkv7_chunk as rwkv7_tests


def test_bucket():
    assert [tuning.bucket(n, 64) for n in (1, 2, 3, 16, 17, 64, 65, 1000)] == [1, 2, 4, 16, 32, 64, 64, 64]


def host_bench(calls: list):
    def bench(fn, quantiles=None):
        t0 = time.perf_counter()
        fn()
        calls.append(fn)
        ms = 1e3 * (time.perf_counter() - t0)
        return [ms, ms, ms] if quantiles else ms
    return bench


@pytest.fixture
def tuned(monkeypatch):
    """Tuning on, fresh tuners, the host clock; yields the list of timed runs."""
    calls = []
    monkeypatch.setattr(tuning, "AUTOTUNE", True)
    monkeypatch.setattr(tuning, "_TUNERS", {})
    monkeypatch.setattr(tuning, "_TUNED", {})
    monkeypatch.setattr(tuning, "_bench", host_bench(calls))
    return calls


def check_every_config_ran(prefix: str, expected: set):
    rows = [row for row in tuning.chosen() if row["kernel"].startswith(prefix)]
    assert {row["kernel"] for row in rows} == expected
    for row in rows:
        timed = [{k: v for k, v in t.items() if k != "ms"} for t in row["timings"]]
        assert len(timed) > 1 and row["best"] in timed


# sm_count 1: the class has programs to spare (64-wide blocks on the list); the default count
# (132): few programs (16-wide blocks on the list)
@pytest.mark.parametrize("sms", [1, 132])
def test_tuned_delta_rule_matches_the_token_loop(tuned, monkeypatch, sms):
    # the device's own count on a GPU, DEFAULT_SM_COUNT elsewhere: both replaced
    monkeypatch.setattr(launch_choices, "_sm_count", lambda device: sms)
    seed = case_seed()
    xs = delta_rule_tests.make_inputs(1, 2 * delta_rule_tests.CHUNK + 3, 2, 32, 64, "strong", True,
                                      torch.float32, seed)
    assert_matches_reference(triton_chunk_delta_rule, naive_delta_rule, xs,
                             ("q", "k", "v", "beta", "g", "initial_state"), seed, 1e-4, 1e-4)
    check_every_config_ran("delta_rule.", {f"delta_rule.{name}" for name in (
        "prep", "fwd", "output", "bwd_local", "bwd_state", "bwd_chunk")})
    # the sequential kernels' value blocks on the list follow the class's programs
    widths = {t["BV"] for row in tuning.chosen() if row["kernel"] in ("delta_rule.fwd", "delta_rule.bwd_state")
              for t in row["timings"]}
    assert widths == ({32, 64} if sms == 1 else {16, 32})


class NoLaunch:
    def __getitem__(self, grid):
        raise AssertionError("a tuned class was launched through its tuner")


def test_a_tuned_class_is_launched_directly(tuned, monkeypatch):
    xs = delta_rule_tests.make_inputs(1, delta_rule_tests.CHUNK + 3, 2, 32, 32, "weak", False,
                                      torch.float32, case_seed())
    q, k, v, beta, g, _ = xs
    first = triton_chunk_delta_rule(q, k, v, beta, g)[0]
    timed = len(tuned)
    assert timed > 0 and tuning.chosen()
    # every tuner replaced by one that fails when launched: the second call must not use them
    monkeypatch.setattr(tuning, "_TUNERS", {key: NoLaunch() for key in tuning._TUNERS})
    second = triton_chunk_delta_rule(q, k, v, beta, g)[0]
    assert len(tuned) == timed and torch.equal(first, second)


def test_tuned_rwkv7_matches_the_token_loop(tuned):
    seed = case_seed()
    xs = rwkv7_tests.make_inputs(1, 2 * rwkv7_tests.CHUNK + 5, 1, 32, 48, "mixed", True,
                                 torch.float32, seed)
    assert_matches_reference(triton_chunk_rwkv7, naive_rwkv7, xs, ("r", "w", "k", "v", "a", "b", "h0"),
                             seed, 1e-4, 1e-4)
    # the prep has one configuration (it is not tuned)
    check_every_config_ran("rwkv7.", {"rwkv7.fwd_state", "rwkv7.output", "rwkv7.bwd_state"})


def test_tuning_is_off_unless_asked_and_never_runs_while_compiling(tuned, monkeypatch):
    # found on an H100: under torch.compile, Dynamo recorded the autotuned launch without running
    # it, and reading the tuner's best configuration failed ("no attribute 'best_config'")
    launched = []

    def kernel_grid(grid):
        return lambda **kw: launched.append((grid, kw))

    class Kernel:
        __getitem__ = staticmethod(kernel_grid)

    configs = [tuning.config(4, 1, BV=32), tuning.config(8, 2, BV=64)]
    monkeypatch.setattr(tuning.torch.compiler, "is_compiling", lambda: True)
    chosen = tuning.launch("fake", Kernel(), lambda m: (m["BV"],), configs, ("class",), {"x": 1})
    assert chosen == {"BV": 32, "num_warps": 4, "num_stages": 1}
    assert launched == [((32,), {"x": 1, "BV": 32, "num_warps": 4, "num_stages": 1})]
    assert tuned == [] and tuning.chosen() == []  # nothing timed, no tuner made


def test_a_traced_launch_takes_the_configuration_its_class_tuned(monkeypatch):
    launched = []

    class Kernel:
        __getitem__ = staticmethod(lambda grid: lambda **kw: launched.append((grid, kw)))

    configs = [tuning.config(4, 1, BV=32), tuning.config(8, 2, BV=64)]
    monkeypatch.setattr(tuning, "_TUNED", {("fake", ("class",)): tuning._as_kwargs(configs[1])})
    monkeypatch.setattr(tuning.torch.compiler, "is_compiling", lambda: True)
    chosen = tuning.launch("fake", Kernel(), lambda m: (m["BV"],), configs, ("class",), {"x": 1})
    assert chosen == {"BV": 64, "num_warps": 8, "num_stages": 2}
    assert launched == [((64,), {"x": 1, **chosen})]
    # another class of the same kernel was not tuned: the default
    other = tuning.launch("fake", Kernel(), lambda m: (m["BV"],), configs, ("other",), {"x": 1})
    assert other == {"BV": 32, "num_warps": 4, "num_stages": 1}


def test_tuning_is_opt_in(monkeypatch):
    import importlib
    monkeypatch.delenv("LTM_AUTOTUNE", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    try:
        assert not importlib.reload(tuning).AUTOTUNE
        monkeypatch.setenv("LTM_AUTOTUNE", "1")
        assert importlib.reload(tuning).AUTOTUNE
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        assert not importlib.reload(tuning).AUTOTUNE
    finally:
        monkeypatch.undo()
        importlib.reload(tuning)


def test_per_class_builds_each_class_list_once():
    built = []

    @tuning.per_class
    def configs(shape_class):
        built.append(shape_class)
        return [tuning.config(4, 2, BV=shape_class[0]), tuning.config(4, 1, BV=shape_class[0])]

    first, again, other = configs((32, "bf16")), configs((32, "bf16")), configs((64, "bf16"))
    assert first is again and isinstance(first, tuple) and len(first) == 2
    assert built == [(32, "bf16"), (64, "bf16")]
    assert [c.kwargs["BV"] for c in other] == [64, 64]
    # the launchers' lists keep their content through the cache
    cls = launch_choices._shape_class(2, 8192, 8, 128, 128, "bf16", None)
    assert launch_choices._overlapped_configs(cls)[0].kwargs["BV"] == launch_choices._sequential_configs(cls)[0].kwargs["BV"]
