"""`ltm.bench.host_overhead`'s CPU-side parts: the options each run of ours takes, the runs per
implementation, the passes it times and its command line (the timings themselves need a GPU)."""
import pytest
import torch

from ltm.bench.host_overhead import launch_options, parse, pass_fn, runs_of


def test_launch_options_pass_nothing_for_the_defaults_and_force_the_rest():
    assert launch_options(0, 2, "default", "default") == {
        "segments": None, "fuse_output": None, "overlap_output": None, "warmup": None}
    forced = launch_options(8, 4, "none", "both", "off")
    assert forced == {"segments": (8, 4), "fuse_output": "none", "overlap_output": "both",
                      "warmup": False}
    assert launch_options(0, 2, "inference", "default", "on")["warmup"] is True


def test_ours_runs_every_combination_and_fla_its_defaults_once():
    args = parse(["out.json", "--segments", "0", "8", "--segment-fill", "2", "4",
                  "--fused-output", "none", "both", "--warmup", "off", "on"])
    runs = runs_of("triton", args)
    # segments 0 takes no fill: 1 + 2 fills, times 2 fused choices, times 2 warm-ups
    assert len(runs) == (1 + 2) * 2 * 2 and len(set(runs)) == len(runs)
    assert {(n, f) for n, f, *_ in runs} == {(0, 2), (8, 2), (8, 4)}
    assert runs_of("fla", args) == [(0, 2, "default", "default", "default")]


def test_the_passes_time_a_forward_without_grad_and_a_backward_that_accumulates_nothing():
    w = torch.randn(5, 3, requires_grad=True)
    x = {"x": torch.randn(4, 5, requires_grad=True), "w": w}
    fn = lambda inputs: torch.tanh(inputs["x"] @ inputs["w"])  # noqa: E731
    out = pass_fn(fn, x, backward=False)()
    assert out.grad_fn is None and out.shape == (4, 3)
    step = pass_fn(fn, x, backward=True)
    dx, dw = step()
    dx2, _ = step()
    assert torch.equal(dx, dx2) and w.grad is None and x["x"].grad is None
    # a linear function's gradients against the closed form, on the cotangent the pass drew
    torch.manual_seed(0)
    gx, gw = pass_fn(lambda inputs: inputs["x"] @ inputs["w"], x, backward=True)()
    torch.manual_seed(0)
    do = torch.randn(4, 3)
    assert torch.allclose(gx, do @ w.detach().T) and torch.allclose(gw, x["x"].detach().T @ do)


def test_a_bad_choice_is_refused_by_the_command_line(capsys):
    with pytest.raises(SystemExit):
        parse(["out.json", "--fused-output", "sometimes"])
    assert "invalid choice: 'sometimes'" in capsys.readouterr().err
