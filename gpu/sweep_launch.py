"""Forward+backward time of our Triton ops under other launch choices (value block, warps,
pipeline stages), to pick the launchers' defaults from measurements.

    python3 gpu/sweep_launch.py [rwkv7] [delta_rule] [sequential] [bwd_chunk] [prep] [output] [bwd_local]

Each row replaces the op module's `_value_block` / `_launch_options` (`sequential`: only the
delta rule's `_sequential_launch_options`, the two kernels that walk the chunks in order; `bwd_chunk`: only
`_bwd_chunk_launch_options` and `_bwd_chunk_value_block`; `prep`, `output`, `bwd_local`: only
that kernel's launch options) for the
duration of one measurement (triton.testing.do_bench median, bf16 inputs as a layer feeds them).
"""
import itertools
import sys
from unittest import mock

import torch
import triton.testing

from ltm.bench.kernels import make_inputs
from ltm.kernels import delta_rule as delta_rule_module
from ltm.kernels import rwkv7 as rwkv7_module

SHAPES = [(8, 2048, 8, 128), (16, 1024, 12, 64)]


def fwd_bwd_ms(fn, x) -> float:
    def once():
        out = fn(x)
        out.backward(grad)
    grad = torch.randn_like(fn(x))
    once()
    return triton.testing.do_bench(once, warmup=25, rep=150)


def rwkv7_rows():
    for shape, value_block, warps in itertools.product(SHAPES, (8, 16, 32), (2, 4, 8)):
        x = make_inputs("rwkv7", *shape, torch.bfloat16, torch.device("cuda"))
        def fn(x):
            return rwkv7_module.fused_recurrent_rwkv7(x["r"], x["w"], x["k"], x["v"], x["a"], x["b"])[0]
        with mock.patch.object(rwkv7_module, "_value_block", lambda K, V: min(value_block, V)), \
                mock.patch.object(rwkv7_module, "_launch_options", lambda K, V: {"num_warps": warps}):
            yield "rwkv7", shape, f"BV={value_block} warps={warps}", fwd_bwd_ms(fn, x)


def delta_rule_rows():
    # (value block, warps, stages): today's choices for K=128 and K=64 first, then neighbours;
    # no 16-wide blocks: they crash with an illegal memory access on Hopper, which ends the process
    choices = [(32, 8, 1), (32, 8, 2), (64, 8, 1), (64, 8, 2), (32, 4, 1), (32, 4, 2)]
    for shape, (value_block, warps, stages) in itertools.product(SHAPES, choices):
        x = make_inputs("gated_delta_rule", *shape, torch.bfloat16, torch.device("cuda"))
        def fn(x):
            return delta_rule_module.chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"])[0]
        options = {"num_warps": warps, "num_stages": stages}
        with mock.patch.object(delta_rule_module, "_value_block", lambda K, V: min(value_block, V)), \
                mock.patch.object(delta_rule_module, "_launch_options", lambda K: options):
            try:
                ms = fwd_bwd_ms(fn, x)
            except Exception as err:  # e.g. out of shared memory for this choice
                print(f"delta_rule {shape} BV={value_block} warps={warps} stages={stages}: "
                      f"{type(err).__name__}: {str(err)[:100]}", flush=True)
                continue
            yield "gated_delta_rule", shape, f"BV={value_block} warps={warps} stages={stages}", ms


def sequential_rows():
    shapes = [(8, 2048, 8, 128), (2, 8192, 8, 128), (8, 2048, 16, 64), (8, 2048, 12, 64)]
    for shape, (warps, stages) in itertools.product(shapes, [(8, 1), (8, 2), (8, 3), (4, 2), (4, 3)]):
        x = make_inputs("gated_delta_rule", *shape, torch.bfloat16, torch.device("cuda"))
        def fn(x):
            return delta_rule_module.chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"])[0]
        options = {"num_warps": warps, "num_stages": stages}
        with mock.patch.object(delta_rule_module, "_sequential_launch_options", lambda K: options):
            try:
                fwd = triton.testing.do_bench(lambda: fn(x), warmup=25, rep=100)
                ms = fwd_bwd_ms(fn, x)
            except Exception as err:
                print(f"sequential {shape} warps={warps} stages={stages}: "
                      f"{type(err).__name__}: {str(err)[:100]}", flush=True)
                continue
            yield "sequential", shape, f"warps={warps} stages={stages} fwd={fwd:.3f}", ms


def bwd_chunk_rows():
    shapes = [(8, 2048, 8, 128), (8, 2048, 12, 64)]
    # no 16 warps: they crashed at K = 64 with an illegal memory access, which ends the process
    choices = [(32, 8, 2), (64, 8, 2), (64, 8, 1), (64, 4, 2), (128, 8, 1)]
    for shape, (value_block, warps, stages) in itertools.product(shapes, choices):
        if value_block > shape[3]:
            continue
        x = make_inputs("gated_delta_rule", *shape, torch.bfloat16, torch.device("cuda"))
        def fn(x):
            return delta_rule_module.chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"])[0]
        options = {"num_warps": warps, "num_stages": stages}
        with mock.patch.object(delta_rule_module, "_bwd_chunk_launch_options", lambda K: options), \
                mock.patch.object(delta_rule_module, "_bwd_chunk_value_block", lambda K, V: value_block):
            try:
                ms = fwd_bwd_ms(fn, x)
            except Exception as err:
                print(f"bwd_chunk {shape} BV={value_block} warps={warps} stages={stages}: "
                      f"{type(err).__name__}: {str(err)[:100]}", flush=True)
                continue
            yield "bwd_chunk", shape, f"BV={value_block} warps={warps} stages={stages}", ms


def per_kernel_rows(option_function: str, backward: bool):
    """Warps and stages of one kernel (`option_function` names its launch-options function)."""
    shapes = [(8, 2048, 8, 128), (8, 2048, 12, 64)]
    for shape, (warps, stages) in itertools.product(shapes, [(8, 1), (8, 2), (4, 1), (4, 2), (2, 1), (2, 2)]):
        x = make_inputs("gated_delta_rule", *shape, torch.bfloat16, torch.device("cuda"))
        def fn(x):
            return delta_rule_module.chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"])[0]
        options = {"num_warps": warps, "num_stages": stages}
        with mock.patch.object(delta_rule_module, option_function, lambda K: options):
            try:
                if backward:
                    ms = fwd_bwd_ms(fn, x)
                else:
                    ms = triton.testing.do_bench(lambda: fn(x), warmup=25, rep=100)
            except Exception as err:
                print(f"{option_function} {shape} warps={warps} stages={stages}: "
                      f"{type(err).__name__}: {str(err)[:100]}", flush=True)
                continue
            what = "fwd+bwd" if backward else "fwd"
            yield f"{option_function[1:-15]} ({what})", shape, f"warps={warps} stages={stages}", ms


def main() -> None:
    ops = sys.argv[1:] or ["rwkv7", "delta_rule"]
    print(torch.cuda.get_device_name(0), "torch", torch.__version__, "triton", triton.__version__)
    for op in ops:
        rows = {"rwkv7": rwkv7_rows, "delta_rule": delta_rule_rows,
                "sequential": sequential_rows, "bwd_chunk": bwd_chunk_rows,
                "prep": lambda: per_kernel_rows("_prep_launch_options", False),
                "output": lambda: per_kernel_rows("_output_launch_options", False),
                "bwd_local": lambda: per_kernel_rows("_bwd_local_launch_options", True)}[op]()
        for name, shape, choice, ms in rows:
            print(f"{name:17} {','.join(map(str, shape)):15} {choice:28} {ms:8.3f} ms", flush=True)


if __name__ == "__main__":
    main()
