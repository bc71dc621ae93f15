"""ltm.bench.titans_depths on the CPU (Triton's interpreter): every row is there, the delta rule
is each pass's unit, and a bad shape is a one-line error."""
import pytest

from ltm.bench import titans_depths
from ltm.ops.titans import titans_memory

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_table_has_each_depth_and_kernel_beside_the_delta_rule():
    rows = titans_depths.table(["1,20,2,8"], [1, 2], ["triton", "torch"], "cpu")
    impls = ["delta_rule triton"] + [f"titans depth {d} {k}" for d in (1, 2)
                                     for k in ("triton", "torch")]
    assert [(r["pass"], r["impl"]) for r in rows] == [(p, i) for p in ("fwd", "fwd+bwd")
                                                      for i in impls]
    assert all(r["ms"] > 0 for r in rows)
    assert [r["x_delta_rule"] for r in rows if r["impl"] == "delta_rule triton"] == [1.0, 1.0]


def test_long_shapes_leave_out_the_chunked_pytorch_form():
    x = titans_depths.make_inputs(2, 20, 1, 8, titans_depths.torch.float32, "cpu")
    calls = titans_depths.runners(x, [2], ["triton", "torch"], max_torch_tokens=39)
    assert sorted(calls) == ["delta_rule triton", "titans depth 2 triton"]


def test_the_weights_are_the_mixers_shapes_and_both_kernels_compute_one_function():
    x = titans_depths.make_inputs(1, 19, 2, 8, titans_depths.torch.float32, "cpu")
    weights = titans_depths.memory_weights(2, 2, 8, "cpu")
    assert [tuple(w.shape) for w in weights] == [(2, 8, 16), (2, 16, 8)]
    outs = [titans_memory(x["q"], x["k"], x["v"], x["theta"], x["alpha"], x["eta"], weights,
                          kernel=kernel, chunk_size=16, grad_clip=1.0)[0] for kernel in ("triton", "torch")]
    assert (outs[0] - outs[1]).abs().max() < 1e-5


def test_a_bad_shape_is_a_one_line_error(capsys):
    with pytest.raises(SystemExit):
        titans_depths.main(["--shapes", "8,2048,12", "--device", "cpu"])
    assert "expected B,T,H,D" in capsys.readouterr().err
