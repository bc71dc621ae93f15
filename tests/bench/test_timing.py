"""ltm.bench.timing's contract, on a fake clock (nothing here is timed): how often each function
calls what it times and when it synchronises, which readings it keeps and how it reduces them, a
one-line refusal of bad arguments, and the GPU paths refused without CUDA."""
import pytest
import torch

from ltm.bench import timing


class FakeClock:
    """A clock that reads `readings` (seconds) in turn and logs each reading beside the calls."""

    def __init__(self, readings: list[float], log: list[str]):
        self.readings, self.log = iter(readings), log

    def __call__(self) -> float:
        self.log.append("clock")
        return next(self.readings)


def logged(log: list[str], name: str):
    return lambda: log.append(name)


def test_host_ms_warms_up_then_takes_the_median_of_the_synchronised_calls():
    log: list[str] = []
    # three timed calls of 5, 1 and 3 ms (a start and an end reading each)
    clock = FakeClock([0.0, 0.005, 1.0, 1.001, 2.0, 2.003], log)
    ms = timing.host_ms(logged(log, "fn"), 3, warmup=2, sync=logged(log, "sync"), clock=clock)
    assert ms == pytest.approx(3.0)
    assert log[:2] == ["fn", "fn"]  # the untimed warm-up, no clock
    assert log[2:] == ["sync", "clock", "fn", "sync", "clock"] * 3


def test_host_ms_goes_on_until_the_minimum_total_time():
    log: list[str] = []
    # begun at 0; the loop checks the total before each call once `repeats` are in
    readings = [0.0,
                0.0, 0.001,          # call 1: 1 ms
                0.001, 0.003,        # call 2: 2 ms
                0.003,               # total 3 ms < 10: another call
                0.003, 0.007,        # call 3: 4 ms
                0.012]               # total 12 ms: done
    ms = timing.host_ms(logged(log, "fn"), 2, warmup=0, min_total_ms=10, clock=FakeClock(readings, log))
    assert log.count("fn") == 3 and ms == pytest.approx(2.0)


def test_per_call_ms_is_the_mean_of_calls_back_to_back():
    log: list[str] = []
    ms = timing.per_call_ms(logged(log, "fn"), 4, warmup=1, sync=logged(log, "sync"),
                            clock=FakeClock([10.0, 10.02], log))
    assert ms == pytest.approx(5.0)
    assert log == ["fn", "sync", "clock", "fn", "fn", "fn", "fn", "sync", "clock"]


def test_per_call_ms_without_waiting_reads_the_clock_before_the_device_drains():
    log: list[str] = []
    timing.per_call_ms(logged(log, "fn"), 2, sync=logged(log, "sync"), wait_for_device=False,
                       clock=FakeClock([0.0, 1.0], log))
    assert log == ["sync", "clock", "fn", "fn", "clock", "sync"]


def test_first_call_s_times_one_synchronised_call_in_seconds():
    log: list[str] = []
    seconds = timing.first_call_s(logged(log, "fn"), sync=logged(log, "sync"),
                                  clock=FakeClock([3.0, 5.5], log))
    assert seconds == pytest.approx(2.5)
    assert log == ["sync", "clock", "fn", "sync", "clock"]


@pytest.mark.parametrize("call", [
    lambda: timing.host_ms(lambda: None, 0),
    lambda: timing.host_ms(lambda: None, 3, warmup=-1),
    lambda: timing.host_ms(lambda: None, 3, min_total_ms=-1.0),
    lambda: timing.per_call_ms(lambda: None, 0),
    lambda: timing.event_ms(lambda: None, 0),
    lambda: timing.gpu_ms(lambda: None, rep_ms=0),
    lambda: timing.gpu_ms(lambda: None, return_mode="average"),
    lambda: timing.graph_ms(lambda: None, return_mode="p50"),
])
def test_bad_arguments_are_refused_in_one_line(call):
    with pytest.raises(ValueError) as err:
        call()
    assert "\n" not in str(err.value) and "must be" in str(err.value)


@pytest.mark.parametrize("call", [
    lambda: timing.gpu_ms(lambda: None),
    lambda: timing.graph_ms(lambda: None),
    lambda: timing.event_ms(lambda: None, 3),
])
def test_the_gpu_paths_refuse_a_machine_without_cuda(monkeypatch, call):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs a CUDA device") as err:
        call()
    assert "\n" not in str(err.value)


def test_gpu_ms_and_graph_ms_hand_their_settings_to_triton(monkeypatch):
    testing = pytest.importorskip("triton.testing")
    seen = {}

    def do_bench(fn, **settings):
        seen["bench"] = settings
        return 1.5

    def do_bench_cudagraph(fn, **settings):
        seen["graph"] = settings
        return 0.5

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(testing, "do_bench", do_bench)
    monkeypatch.setattr(testing, "do_bench_cudagraph", do_bench_cudagraph)
    grads = [torch.zeros(1, requires_grad=True)]
    assert timing.gpu_ms(lambda: None, warmup_ms=10, rep_ms=60, grad_to_none=grads,
                         return_mode="mean") == 1.5
    assert seen["bench"] == {"warmup": 10, "rep": 60, "grad_to_none": grads, "return_mode": "mean"}
    assert timing.graph_ms(lambda: None, rep_ms=60) == 0.5
    assert seen["graph"] == {"rep": 60, "return_mode": "median"}


def test_device_sync_waits_only_for_a_gpu():
    assert timing.device_sync("cpu") is timing.no_sync
    assert timing.device_sync(torch.device("cuda")) is not timing.no_sync
