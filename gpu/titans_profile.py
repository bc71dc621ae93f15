"""Where the Titans memory's time goes on a GPU (issue 56): per-kernel device times of one
forward+backward (torch.profiler), and the op's forward+backward under launch-option variants
(warps, pipelining stages, the deep memory's hidden tile), each checked against the default
options' output, beside our delta rule at the same (B, T, H, D).

    python gpu/titans_profile.py [--shapes 8,2048,12,64 ...] [--linear-chunks | --deep-only]
        [--out F.json]

--linear-chunks: only the linear memory's forward+backward and largest kernels per chunk size.
--deep-only: only the deep memory: its hidden tile per kernel, then chunks 16 and 32.

bf16 inputs as `ltm.bench.titans_depths` makes them (unit q, k; the mixer's gate ranges; clip
1.0). A measurement script: it changes nothing it does not put back.
"""
from __future__ import annotations

import argparse
import json

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import ltm.kernels.titans.chunk as linear_kernel
import ltm.kernels.titans.deep as deep_kernel
from ltm.bench.timing import gpu_ms
from ltm.bench.titans_depths import make_inputs, memory_weights
from ltm.kernels.delta_rule import triton_chunk_delta_rule
from ltm.ops.titans import titans_memory

LINEAR_OPTIONS = [(4, 2), (4, 1), (4, 3)]  # (num_warps, num_stages); the default first
# (num_warps, num_stages, hidden tile) for every deep kernel; the default first
DEEP_OPTIONS = [(8, 1, 64), (8, 2, 64), (4, 2, 64), (4, 2, 32), (8, 1, 32)]
# hidden tiles per deep kernel (states, output, bwd local, bwd state), the default (64 everywhere)
# first, then gpu/pending/titans-deep-hidden-tiles.patch's (128 / 128 / 128 / 64). ptxas for sm_90a
# with Triton 3.6 (bf16, K = V = 64, E = 128, 8 warps) spills, in bytes a thread, at chunk 16 at
# tiles of 64 96 / 144 / 804 / 1,208; at 128 0 / 0 / 272 / 8,248; at 32 0 / 0 / 0 / 188; at chunk
# 32 at 64 764 / 484 / 1,800 / 4,596; at 128 552 / 0 / 1,236 / 18,716; at 32 128 / 12 / 244 /
# 1,996 (`tests/kernels/shared_memory_probe.py --deep-tiles 32`, loads)
DEEP_TILES = [{"states": 64, "output": 64, "bwd_local": 64, "bwd_state": 64},
              {"states": 128, "output": 128, "bwd_local": 64, "bwd_state": 64},
              {"states": 128, "output": 128, "bwd_local": 128, "bwd_state": 64},
              {"states": 128, "output": 128, "bwd_local": 128, "bwd_state": 32},
              {"states": 128, "output": 128, "bwd_local": 32, "bwd_state": 32},
              {"states": 32, "output": 128, "bwd_local": 32, "bwd_state": 32}]


def memory_call(x: dict, weights: list, chunk: int):
    def run():
        out = titans_memory(x["q"], x["k"], x["v"], x["theta"], x["alpha"], x["eta"], weights,
                            kernel="triton", chunk_size=chunk, grad_clip=1.0)[0]
        out.float().sum().backward()
        return out
    return run


def delta_rule_call(x: dict):
    """Our delta rule's forward+backward at the same inputs: the issue's yardstick."""
    def run():
        out = triton_chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"])[0]
        out.float().sum().backward()
        return out
    return run


def kernel_times(run, reps: int = 5) -> list[dict]:
    """Device time per kernel name per call, largest first: the kernels' own rows only (an op's
    row carries the time of the kernels it launched, which would count them twice)."""
    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run()
        torch.cuda.synchronize()
    rows = [{"kernel": e.key[:90], "ms": round(e.self_device_time_total / reps / 1e3, 4),
             "calls": e.count // reps}
            for e in prof.key_averages()
            if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0]
    return sorted(rows, key=lambda r: -r["ms"])


def with_options(patch, restore, run, leaves, ref):
    patch()
    try:
        out = run().float()
        err = ((out - ref).norm() / ref.norm()).item()
        return {"ms": round(gpu_ms(run, warmup_ms=10, rep_ms=100, grad_to_none=leaves), 4),
                "rel_err_vs_default": err}
    except Exception as e:  # a variant that does not compile is a finding, not a crash
        return {"error": f"{type(e).__name__}: {str(e)[:160]}"}
    finally:
        restore()


def linear_variants(x, weights, chunk, leaves) -> list[dict]:
    run = memory_call(x, weights, chunk)
    ref = run().detach().float()
    original = linear_kernel._launch_options
    rows = []
    for warps, stages in LINEAR_OPTIONS:
        def patch(w=warps, s=stages):
            linear_kernel._launch_options = lambda K, V: {"num_warps": w, "num_stages": s}
        res = with_options(patch, lambda: setattr(linear_kernel, "_launch_options", original),
                           run, leaves, ref)
        rows.append({"depth": 1, "chunk": chunk, "num_warps": warps, "num_stages": stages, **res})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def deep_variants(x, weights, chunk, leaves) -> list[dict]:
    run = memory_call(x, weights, chunk)
    ref = run().detach().float()
    original = deep_kernel._dims
    rows = []
    for warps, stages, tile in DEEP_OPTIONS:
        def patched(*args, w=warps, s=stages, be=tile, **kw):
            dims = original(*args, **kw)
            dims.update(num_warps=w, num_stages=s, BE=be)
            return dims

        res = with_options(lambda p=patched: setattr(deep_kernel, "_dims", p),
                           lambda: setattr(deep_kernel, "_dims", original), run, leaves, ref)
        rows.append({"depth": 2, "chunk": chunk, "num_warps": warps, "num_stages": stages,
                     "BE": tile, **res})
        print(json.dumps(rows[-1]), flush=True)
    return rows


class _Relaunch:
    """A kernel whose launches take `overrides` over the launcher's keyword arguments."""

    def __init__(self, kernel, overrides: dict):
        self.kernel, self.overrides = kernel, overrides

    def __getitem__(self, grid):
        return lambda *args, **kw: self.kernel[grid](*args, **(kw | self.overrides))


def deep_tile_variants(x, weights, chunk, leaves) -> list[dict]:
    """The deep memory with a hidden tile of its own for some of its kernels (DEEP_TILES)."""
    run = memory_call(x, weights, chunk)
    ref = run().detach().float()
    names = {"states": "_deep_states_kernel", "output": "_deep_output_kernel",
             "bwd_local": "_deep_bwd_local_kernel", "bwd_state": "_deep_bwd_state_kernel"}
    originals = {n: getattr(deep_kernel, n) for n in names.values()}
    rows = []
    for tiles in DEEP_TILES:
        def patch(tiles=tiles):
            for short, be in tiles.items():
                setattr(deep_kernel, names[short], _Relaunch(originals[names[short]], {"BE": be}))

        def restore():
            for name, kernel in originals.items():
                setattr(deep_kernel, name, kernel)

        rows.append({"depth": 2, "chunk": chunk, "tiles": tiles,
                     **with_options(patch, restore, run, leaves, ref)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def linear_chunks(shape: str) -> dict:
    """The linear memory's forward+backward time and largest kernels per chunk size."""
    B, T, H, D = (int(n) for n in shape.split(","))
    x = make_inputs(B, T, H, D, torch.bfloat16, "cuda")
    weights = memory_weights(1, H, D, "cuda")
    report = {"shape": shape, "delta_rule_fwd_bwd_ms": round(
        gpu_ms(delta_rule_call(x), warmup_ms=10, rep_ms=100, grad_to_none=list(x.values())), 4)}
    print(json.dumps(report), flush=True)
    for chunk in (16, 32, 64):
        run = memory_call(x, weights, chunk)
        ms = gpu_ms(run, warmup_ms=10, rep_ms=100, grad_to_none=list(x.values()))
        top = kernel_times(run)
        report[f"c{chunk}"] = {"fwd_bwd_ms": round(ms, 4), "kernels": top[:6]}
        print(json.dumps({"shape": shape, "chunk": chunk, "fwd_bwd_ms": round(ms, 4),
                          "top": [(r["kernel"][:24], r["ms"]) for r in top[:4]]}), flush=True)
    return report


def deep_at_chunk(x: dict, weights: list, chunk: int, leaves: list) -> dict:
    """The deep memory's forward+backward at one chunk size, default options, with its largest
    kernels (at 32 another function: each token's gradient at its 32-token chunk's weights)."""
    run = memory_call(x, weights, chunk)
    ms = round(gpu_ms(run, warmup_ms=10, rep_ms=100, grad_to_none=leaves), 4)
    print(json.dumps({"depth": 2, "chunk": chunk, "ms": ms}), flush=True)
    return {"depth": 2, "chunk": chunk, "ms": ms, "kernels": kernel_times(run)[:6]}


def shape_report(shape: str) -> dict:
    B, T, H, D = (int(n) for n in shape.split(","))
    x = make_inputs(B, T, H, D, torch.bfloat16, "cuda")
    leaves = list(x.values())
    delta_rule = delta_rule_call(x)
    report = {"shape": shape,
              "delta_rule_fwd_bwd_ms": round(gpu_ms(delta_rule, warmup_ms=10, rep_ms=100,
                                                    grad_to_none=leaves), 4),
              "delta_rule_kernels": kernel_times(delta_rule)[:8]}
    print(json.dumps({k: v for k, v in report.items() if k != "delta_rule_kernels"}), flush=True)
    lin_w = memory_weights(1, H, D, "cuda")
    deep_w = memory_weights(2, H, D, "cuda")
    report["profiles"] = {}
    for name, weights, chunk in (("linear c16", lin_w, 16), ("linear c32", lin_w, 32),
                                 ("linear c64", lin_w, 64), ("deep c16", deep_w, 16)):
        rows = kernel_times(memory_call(x, weights, chunk))
        report["profiles"][name] = rows[:14]
        print(f"== {shape} {name}: device total {sum(r['ms'] for r in rows):.3f} ms", flush=True)
        for r in rows[:14]:
            print(f"   {r['ms']:8.4f} ms x{r['calls']:<3d} {r['kernel']}", flush=True)
    report["variants"] = []
    for chunk in (16, 64):
        report["variants"] += linear_variants(x, lin_w, chunk, leaves)
    report["variants"] += deep_variants(x, deep_w, 16, leaves)
    report["variants"] += deep_tile_variants(x, deep_w, 16, leaves)
    # the deep memory at chunk 32, its default since 2026-12-08 (another function: each token's
    # gradient taken at its 32-token chunk's starting weights), beside the rows above at 16
    report["variants"].append(deep_at_chunk(x, deep_w, 32, leaves))
    return report


def deep_report(shape: str, tile_chunk: int = 32) -> dict:
    """`--deep-only`: the hidden tile per kernel (DEEP_TILES) at `tile_chunk`, then the deep
    memory at its two chunk sizes (16, and 32, the default since 2026-12-08: half the chunks in
    turn, another function) with their largest kernels: what the next change to
    `kernels/titans/deep.py` needs, in a few minutes of a fresh GPU instead of `shape_report`'s
    whole list."""
    B, T, H, D = (int(n) for n in shape.split(","))
    x = make_inputs(B, T, H, D, torch.bfloat16, "cuda")
    leaves, weights = list(x.values()), memory_weights(2, H, D, "cuda")
    tiles = deep_tile_variants(x, weights, tile_chunk, leaves)  # first: what a short call needs
    return {"shape": shape, "chunks": [deep_at_chunk(x, weights, c, leaves) for c in (16, 32)],
            "tiles": tiles}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["8,2048,12,64", "2,8192,12,64"])
    parser.add_argument("--out", default=None)
    parser.add_argument("--linear-chunks", action="store_true",
                        help="only the linear memory per chunk size (16, 32, 64)")
    parser.add_argument("--deep-only", action="store_true",
                        help="only the deep memory: DEEP_TILES, then chunks 16 and 32")
    args = parser.parse_args()
    import triton
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__}
    print(json.dumps(env), flush=True)
    report_of = (linear_chunks if args.linear_chunks else deep_report if args.deep_only
                 else shape_report)
    reports = []
    for shape in args.shapes:  # written after each shape: a call cut short keeps what it measured
        reports.append(report_of(shape))
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"env": env, "reports": reports}, f, indent=1)


if __name__ == "__main__":
    main()
