"""Compile every Triton kernel of the chunked ops for an H100 (sm_90) on the CPU, with the launch
choices their launchers make, and print the shared memory each asks for, one JSON line per kernel.

Run as a script, without TRITON_INTERPRET (the interpreter neither compiles nor reads launch
choices): `python tests/kernels/shared_memory_probe.py`. The launchers run on CPU tensors with
Triton's launch replaced by a recorder, so nothing executes; the recorded calls are then compiled
for the GPU target. No GPU is needed, only Triton's bundled ptxas.

With `--registers` each row also gives the registers per thread and the bytes per thread that
ptxas spills to local memory (`ptxas -v` on the kernel's PTX): a CPU-side look at what a
launch choice costs in registers, to be timed on a GPU before anything is concluded.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# the launcher modules of the chunked ops (the kernels themselves are in chunk_fwd / chunk_bwd)
from ltm.kernels.delta_rule import chunk as delta_rule  # noqa: E402
from ltm.kernels.rwkv7 import chunk as rwkv7_chunk  # noqa: E402
from ltm.kernels import tuning  # noqa: E402
from ltm.kernels.titans import chunk as titans_chunk  # noqa: E402
from ltm.kernels.titans import deep as titans_deep  # noqa: E402

# the launchers' defaults (the first configuration of each list), which run where no tuning does;
# the other configurations are only ever tuned on a GPU, where one that does not fit is skipped
tuning.AUTOTUNE = False

HOPPER = GPUTarget("cuda", 90, 32)
POINTER = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.int32: "*i32"}


def record_launches(launch) -> list[tuple]:
    """(kernel, bound arguments, launch options) of every kernel launch made by `launch()`."""
    calls = []

    def record(self, *args, grid, warmup, **kwargs):
        options = {key: kwargs.pop(key) for key in ("num_warps", "num_stages") if key in kwargs}
        bound = dict(zip(self.arg_names, args), **kwargs)
        # the arguments a launch leaves to the kernel's defaults (a segmented pass's switches)
        bound |= {p.name: p.default for p in self.params if p.name not in bound and p.has_default}
        calls.append((self, bound, options))

    original = JITFunction.run
    JITFunction.run = record
    try:
        launch()
    finally:
        JITFunction.run = original
    return calls


def signature_of(kernel: JITFunction, bound: dict) -> tuple[dict, dict]:
    signature, constexprs = {}, {}
    for param in kernel.params:
        value = bound[param.name]
        if param.is_constexpr or value is None:
            signature[param.name], constexprs[param.name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[param.name] = POINTER[value.dtype]
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, int):
            signature[param.name] = "i32"
        else:
            signature[param.name] = "fp32"
    return signature, constexprs


def compiled(kernel: JITFunction, bound: dict, options: dict):
    signature, constexprs = signature_of(kernel, bound)
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    return triton.compile(source, target=HOPPER, options=options)


def registers(ptx: str) -> dict:
    """Registers per thread and spilled bytes per thread of one kernel's PTX (ptxas -v, sm_90a)."""
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.ptx")
        Path(path).write_text(ptx)
        report = subprocess.run([str(ptxas), "-v", "--gpu-name", "sm_90a", path, "-o", os.devnull],
                                capture_output=True, text=True, check=True).stderr
    used = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    return {"registers": int(used.group(1)) if used else None,
            "spill_stores": int(spills.group(1)) if spills else 0,
            "spill_loads": int(spills.group(2)) if spills else 0}


def delta_rule_launches(dtype: torch.dtype, K: int, V: int, H: int = 1) -> list[tuple]:
    # H = 1: the sequential kernels' default for few programs; H = 16: their default otherwise
    B, T = 1, 130
    q, k = torch.randn(B, T, H, K, dtype=dtype), torch.randn(B, T, H, K, dtype=dtype)
    v, beta = torch.randn(B, T, H, V, dtype=dtype), torch.rand(B, T, H, dtype=dtype)
    g, h0 = -torch.rand(B, T, H), torch.randn(B, H, K, V)

    def launch():
        o, ht, saved = delta_rule._delta_rule_fwd(q, k, v, beta, g, K ** -0.5, h0, True)
        delta_rule._delta_rule_bwd(q, k, v, beta, K ** -0.5, h0, saved, torch.randn_like(o),
                                   torch.randn_like(ht))
        # the state passes by segments, forward and backward (off by default; forced here)
        segmented = delta_rule._Options(segments=(1, 8))
        o, ht, saved = delta_rule._delta_rule_fwd(q, k, v, beta, g, K ** -0.5, h0, True,
                                                  options=segmented)
        delta_rule._delta_rule_bwd(q, k, v, beta, K ** -0.5, h0, saved, torch.randn_like(o),
                                   torch.randn_like(ht), options=segmented)
        # the state passes by decay warm-ups (where few programs run; forced here), and the
        # forward without a backward to follow
        warm = delta_rule._Options(segments=(1, 8), warmup=True)
        o, ht, saved = delta_rule._delta_rule_fwd(q, k, v, beta, g, K ** -0.5, h0, True, options=warm)
        delta_rule._delta_rule_bwd(q, k, v, beta, K ** -0.5, h0, saved, torch.randn_like(o),
                                   torch.randn_like(ht), options=warm, gated=True)
        delta_rule._delta_rule_fwd(q, k, v, beta, g, K ** -0.5, h0, True, backward=False, options=warm)
        # the forward without a backward: the state pass with the outputs fused in (forced: the
        # launcher's rule takes it only where programs are many)
        fuses, delta_rule.launch_choices._fuses_output = delta_rule.launch_choices._fuses_output, lambda *a: True
        try:
            delta_rule._delta_rule_fwd(q, k, v, beta, g, K ** -0.5, h0, True, backward=False)
            # ... and by warm-ups (D from L^-1 in the warm-up chunks too)
            delta_rule._delta_rule_fwd(q, k, v, beta, g, K ** -0.5, h0, True, backward=False,
                                       options=warm)
        finally:
            delta_rule.launch_choices._fuses_output = fuses
        # the state pass and the outputs in one launch (forced: the rule takes it at 64-131 programs)
        overlaps = delta_rule.segment_choices._overlaps_output
        delta_rule.segment_choices._overlaps_output = lambda *a, **kw: True
        try:
            delta_rule._delta_rule_fwd(q, k, v, beta, g, K ** -0.5, h0, True)
        finally:
            delta_rule.segment_choices._overlaps_output = overlaps
    return record_launches(launch)


def rwkv7_launches(dtype: torch.dtype, K: int, V: int) -> list[tuple]:
    B, T, H = 1, 40, 1
    r, w, k, a, b = (torch.randn(B, T, H, K, dtype=dtype) for _ in range(5))
    v, h0 = torch.randn(B, T, H, V, dtype=dtype), torch.randn(B, H, K, V)

    def launch():
        o, ht, saved = rwkv7_chunk._rwkv7_fwd(r, w, k, v, a, b, h0, True)
        rwkv7_chunk._rwkv7_bwd(r, w, k, v, a, b, h0, saved, torch.randn_like(o),
                               torch.randn_like(ht))
    return record_launches(launch)


def titans_launches(dtype: torch.dtype, K: int, V: int) -> list[tuple]:
    # the largest chunk each dtype takes at this head size (64 in bfloat16 only, see chunk.py)
    B, T, H, chunk = 1, 40, 1, 64 if dtype == torch.bfloat16 else 32
    q, k = torch.randn(B, T, H, K, dtype=dtype), torch.randn(B, T, H, K, dtype=dtype)
    v, gates = torch.randn(B, T, H, V, dtype=dtype), [torch.rand(B, T, H) for _ in range(3)]
    w0, s0 = torch.randn(B, H, K, V), torch.randn(B, H, K, V)

    def launch():
        o, wt, st, *saved = titans_chunk._titans_fwd(q, k, v, *gates, w0, s0, chunk, 1.0, True)
        titans_chunk._titans_bwd(q, k, v, *gates, *saved, torch.randn_like(o),
                                 torch.randn_like(wt), torch.randn_like(st), chunk, 1.0)
    return record_launches(launch)


def titans_deep_launches(dtype: torch.dtype, K: int, V: int, chunk: int = 32) -> list[tuple]:
    # the deep memory's largest chunk (32) unless told, and its hidden width at titans_expansion 2
    B, T, H, E = 1, 40, 1, 2 * K
    q, k = torch.randn(B, T, H, K, dtype=dtype), torch.randn(B, T, H, K, dtype=dtype)
    v, gates = torch.randn(B, T, H, V, dtype=dtype), [torch.rand(B, T, H) for _ in range(3)]
    state = [torch.randn(B, H, *shape) for shape in ((K, E), (K, E), (E, V), (E, V))]

    def launch():
        o, *outputs = titans_deep._deep_fwd(q, k, v, *gates, *state, chunk, 1.0)
        finals, saved = outputs[:4], outputs[4:]
        titans_deep._deep_bwd(q, k, gates[0], gates[1], gates[2], *saved, torch.randn_like(o),
                              *(torch.randn_like(x) for x in finals), chunk, 1.0)
    return record_launches(launch)


def main(ops: list[str], with_registers: bool = False) -> None:
    # the widest heads the ops take; float16 inputs multiply float32 tiles, as float32 ones do
    K = 128
    # one compilation per distinct (kernel, signature, constants, options): the launchers repeat
    # many (the same kernel at both head counts, forward passes run again by the segmented ones)
    seen: dict[tuple, object] = {}
    for op in ops:
        for dtype in (torch.float32, torch.bfloat16):
            launches = (delta_rule_launches(dtype, K, K) + delta_rule_launches(dtype, K, K, 16)
                        if op == "delta_rule" else rwkv7_launches(dtype, K, K) if op == "rwkv7"
                        else titans_deep_launches(dtype, K, K) if op == "titans_deep"
                        else titans_launches(dtype, K, K))
            for kernel, bound, options in launches:
                signature, constexprs = signature_of(kernel, bound)
                key = (kernel.fn.__qualname__, kernel.fn.__module__, tuple(signature.items()),
                       tuple((k, repr(v)) for k, v in constexprs.items()), tuple(options.items()))
                if key not in seen:
                    seen[key] = compiled(kernel, bound, options)
                done = seen[key]
                row = {"op": op, "kernel": kernel.fn.__name__, "dtype": str(dtype).split(".")[1],
                       "K": K, **options, "BV": bound.get("BV"), "shared": done.metadata.shared,
                       "triton": triton.__version__}
                if with_registers:
                    row.update(registers(done.asm["ptx"]))
                print(json.dumps(row), flush=True)


def deep_tiles(tiles: tuple = (32, 64, 128), warps: tuple = (8,), chunk: int = 16) -> None:
    """`--deep-tiles [CHUNK]`: the deep Titans memory's kernels at the GPU profile's heads (K = V =
    64, hidden 128, bfloat16, chunk 16 unless told) under each hidden tile and warp count,
    registers and spills per row (what gpu/titans_profile.py's tile variants time)."""
    from ltm.kernels.titans import deep
    original = deep._dims
    for tile in tiles:
        for w in warps:
            def dims(*args, be=tile, nw=w, **kw):
                return original(*args, **kw) | {"BE": be, "num_warps": nw}
            deep._dims = dims
            try:
                launches = titans_deep_launches(torch.bfloat16, 64, 64, chunk=chunk)
            finally:
                deep._dims = original
            for kernel, bound, options in launches:
                if "deep" in kernel.fn.__name__:
                    done = compiled(kernel, bound, options)
                    print(json.dumps({"kernel": kernel.fn.__name__, "chunk": chunk, "BE": tile,
                                      **options, "shared": done.metadata.shared,
                                      "triton": triton.__version__,
                                      **registers(done.asm["ptx"])}), flush=True)


if __name__ == "__main__":
    if "--deep-tiles" in sys.argv:
        after = sys.argv[sys.argv.index("--deep-tiles") + 1:]
        sys.exit(deep_tiles(chunk=int(after[0]) if after else 16))
    args = [a for a in sys.argv[1:] if a != "--registers"]
    main(args or ["delta_rule", "rwkv7", "titans", "titans_deep"], "--registers" in sys.argv)
