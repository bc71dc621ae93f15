"""Time of our Triton ops under other launch choices (value block, warps, pipeline stages), to
pick the launchers' defaults from measurements.

    python3 gpu/sweep_launch.py [rwkv7] [delta_rule] [sequential] [bwd_chunk] [prep] [output] [bwd_local]

Each row replaces, for the duration of one measurement (triton.testing.do_bench median, bf16
inputs as a layer feeds them): `rwkv7`, the token loop's `_value_block` and `_launch_options`;
`delta_rule`, the delta rule's `_value_block`; `sequential`, `bwd_chunk`, `prep`, `output`,
`bwd_local`, the launch options of those delta-rule kernels (`bwd_chunk` also its value block).
"""
import itertools
import sys
from unittest import mock

import torch
import triton.testing

from ltm.bench.kernels import make_inputs
# the modules that make the launch choices: the chunked delta rule and the RWKV-7 token loop
from ltm.kernels.delta_rule import chunk as delta_rule_module
from ltm.kernels.rwkv7 import fused_recurrent as rwkv7_module

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
            return rwkv7_module.triton_fused_recurrent_rwkv7(x["r"], x["w"], x["k"], x["v"], x["a"], x["b"])[0]
        with mock.patch.object(rwkv7_module, "_value_block", lambda K, V: min(value_block, V)), \
                mock.patch.object(rwkv7_module, "_launch_options", lambda K, V: {"num_warps": warps}):
            yield "rwkv7", shape, f"BV={value_block} warps={warps}", fwd_bwd_ms(fn, x)


def gated_delta_rule(x):
    return delta_rule_module.triton_chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"])[0]


def delta_rule_rows():
    # the value block of the kernels that split V (all but `_bwd_chunk`, which has its own);
    # no 16-wide blocks here: with block pointers they crashed with an illegal memory access on
    # Hopper (Triton 3.6), which ends the process; gpu/kernel_grid.py tries them, since the port to
    # plain pointers, in a child process
    for shape, value_block in itertools.product(SHAPES, (32, 64)):
        x = make_inputs("gated_delta_rule", *shape, torch.bfloat16, torch.device("cuda"))
        with mock.patch.object(delta_rule_module, "_value_block", lambda K, V: min(value_block, V)):
            try:
                ms = fwd_bwd_ms(gated_delta_rule, x)
            except Exception as err:  # e.g. out of shared memory for this choice
                print(f"delta_rule {shape} BV={value_block}: {type(err).__name__}: {str(err)[:100]}",
                      flush=True)
                continue
            yield "gated_delta_rule", shape, f"BV={value_block}", ms


def kernel_rows(name: str, option_function: str, shapes, choices, backward: bool):
    """One delta-rule kernel's launch choices: `option_function` (and, for choices with "BV",
    `_bwd_chunk_value_block`) replaced for one measurement each; forward time, and fwd+bwd when
    `backward`."""
    for shape, choice in itertools.product(shapes, choices):
        if choice.get("BV", 0) > shape[3]:
            continue
        x = make_inputs("gated_delta_rule", *shape, torch.bfloat16, torch.device("cuda"))
        options = {"num_warps": choice["warps"], "num_stages": choice["stages"]}
        # the option functions take K and, some of them, the tile precision
        patches = {option_function: lambda K, *precision: options}
        if "BV" in choice:
            patches["_bwd_chunk_value_block"] = lambda K, V: choice["BV"]
        label = " ".join(f"{key}={value}" for key, value in choice.items())
        with mock.patch.multiple(delta_rule_module, **patches):
            try:
                fwd = triton.testing.do_bench(lambda: gated_delta_rule(x), warmup=25, rep=100)
                ms = fwd_bwd_ms(gated_delta_rule, x) if backward else fwd
            except Exception as err:
                print(f"{name} {shape} {label}: {type(err).__name__}: {str(err)[:100]}", flush=True)
                continue
        if backward:
            label += f" fwd={fwd:.3f}"
        yield f"{name} ({'fwd+bwd' if backward else 'fwd'})", shape, label, ms


def launch(warps_stages) -> list[dict]:
    return [{"warps": w, "stages": s} for w, s in warps_stages]


# two shapes per head size; the sequential kernels also at batch 2, T = 8192, where they dominate
SHAPES_K128_K64 = [(8, 2048, 8, 128), (8, 2048, 12, 64)]
SEQUENTIAL_SHAPES = [(8, 2048, 8, 128), (2, 8192, 8, 128), (8, 2048, 16, 64), (8, 2048, 12, 64)]
PER_KERNEL = launch([(8, 1), (8, 2), (4, 1), (4, 2), (2, 1), (2, 2)])
# no 16 warps in `_bwd_chunk`: they crashed at K = 64 with an illegal memory access, which ends
# the process
BWD_CHUNK = [{"BV": bv, "warps": w, "stages": s}
             for bv, w, s in [(32, 8, 2), (64, 8, 2), (64, 8, 1), (64, 4, 2), (128, 8, 1)]]


def main() -> None:
    ops = sys.argv[1:] or ["rwkv7", "delta_rule"]
    print(torch.cuda.get_device_name(0), "torch", torch.__version__, "triton", triton.__version__)
    for op in ops:
        rows = {"rwkv7": rwkv7_rows, "delta_rule": delta_rule_rows,
                "sequential": lambda: kernel_rows(
                    "sequential", "_sequential_launch_options", SEQUENTIAL_SHAPES,
                    launch([(8, 1), (8, 2), (8, 3), (4, 2), (4, 3)]), True),
                "bwd_chunk": lambda: kernel_rows(
                    "bwd_chunk", "_bwd_chunk_launch_options", SHAPES_K128_K64, BWD_CHUNK, True),
                "prep": lambda: kernel_rows(
                    "prep", "_prep_launch_options", SHAPES_K128_K64, PER_KERNEL, False),
                "output": lambda: kernel_rows(
                    "output", "_output_launch_options", SHAPES_K128_K64, PER_KERNEL, False),
                "bwd_local": lambda: kernel_rows(
                    "bwd_local", "_bwd_local_launch_options", SHAPES_K128_K64, PER_KERNEL, True)}[op]()
        for name, shape, choice, ms in rows:
            print(f"{name:19} {','.join(map(str, shape)):15} {choice:36} {ms:8.3f} ms", flush=True)


if __name__ == "__main__":
    main()
