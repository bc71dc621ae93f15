"""Benchmark of the linear-attention kernels: token loop, torch chunk form, our Triton kernels,
flash-linear-attention (when installed) and causal SDPA, forward and forward+backward.

    python -m ltm.bench.kernels --out records/bench/kernels-gpu.json
    python -m ltm.bench.kernels --tune [--out PATH]    # the table of model.kernel auto (tune.py)

Every time is the median of `triton.testing.do_bench` on the GPU (a host-clock median on the CPU,
where only the token loop, the torch chunk form and SDPA run, at tiny shapes, in float32). Each row
also gives the floor: max(bytes / copy bandwidth, FLOPs / bf16 matmul rate), both measured in the
same run, with the byte and FLOP counts of `floor_counts`.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
import triton

from ltm.bench.kernel_grid import format_grid, grid_table
from ltm.bench.timing import gpu_ms, host_ms
from ltm.model.config import CHUNK_AUTO
from ltm.params import check

OPS = ("delta_rule", "rwkv7", "gated_delta_rule", "titans")
# the titans op's rows: the linear memory (one [D, D] layer per head) at the mixer's defaults
# (model.titans_chunk_size auto, 64 for the linear memory; model.titans_grad_clip 1.0)
TITANS_CHUNK, TITANS_CLIP = CHUNK_AUTO[1], 1.0
IMPLS = ("naive", "torch_chunk", "triton", "fla", "sdpa")


@dataclasses.dataclass
class KernelBenchConfig:
    # [B, T, H, D] shapes to time every implementation at
    shapes: list[list[int]] = dataclasses.field(default_factory=lambda: [[1, 128, 2, 32]])
    # the token loop is slow: it runs at [B, naive_tokens, H, D] of the first shape only
    naive_tokens: int = 64
    ops: list[str] = dataclasses.field(default_factory=lambda: list(OPS))
    # implementations to time, of naive, torch_chunk, triton, fla and sdpa; empty: all present
    impls: list[str] = dataclasses.field(default_factory=list)
    # "float32", "bfloat16" or "float16"; fla and the Triton kernels are timed on the GPU only
    dtype: str = "float32"
    backward: bool = True
    # do_bench's warm-up and measuring budgets, in milliseconds
    warmup_ms: int = 25
    rep_ms: int = 100

    def __post_init__(self):
        check(all(len(s) == 4 and all(int(n) > 0 for n in s) for s in self.shapes), "shapes",
              "each shape must be four positive integers [B, T, H, D]")
        check(self.naive_tokens > 0, "naive_tokens", "must be positive")
        check(all(op in OPS for op in self.ops), "ops", f"each must be one of {OPS}")
        check(all(name in IMPLS for name in self.impls), "impls", f"each must be one of {IMPLS}")
        check(self.dtype in ("float32", "bfloat16", "float16"), "dtype",
              "must be float32, bfloat16 or float16")
        check(self.warmup_ms > 0 and self.rep_ms > 0, "rep_ms", "budgets must be positive")


GPU_SHAPES = [[8, 2048, 8, 128], [2, 8192, 8, 128], [8, 2048, 16, 64], [4, 4096, 16, 128], [16, 1024, 4, 64]]
# The shape grid of issue 18, [B, T, H, D]: B x T from 8k to 64k tokens, T from 512 to 32k (one
# single 32k sequence among them), H 4..32, D 64 and 128; the three shapes first. Launch
# choices must hold over all of it, not only over the shapes they were tuned on
# (`python -m ltm.bench.kernels --grid`, gpu/kernel_grid.py).
GRID_SHAPES = [
    [8, 2048, 8, 128], [2, 8192, 8, 128], [8, 2048, 16, 64],
    [16, 512, 8, 128], [1, 8192, 4, 128], [4, 4096, 16, 128], [1, 32768, 4, 128],
    [32, 2048, 4, 128], [2, 32768, 8, 128],
    [16, 512, 32, 64], [1, 16384, 8, 64], [16, 4096, 8, 64], [1, 32768, 16, 64],
    [64, 1024, 4, 64], [8, 8192, 32, 64],
]
# RWKV-7 over the same grid (its target, >= 1.3x fla, holds "everywhere on the grid")
RWKV7_GRID_SHAPES = [list(shape) for shape in GRID_SHAPES]


def _optional(module: str, name: str) -> Callable | None:
    """`module.name` when it can be imported (fla, or an op still being written), else None."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def make_inputs(op: str, B: int, T: int, H: int, D: int, dtype: torch.dtype, device) -> dict:
    """Random inputs as a layer feeds them: unit keys, beta in (0, 1), log decays in [-1, 0)."""
    def rand(*shape, scale=1.0):
        return (scale * torch.randn(*shape, device=device)).to(dtype).requires_grad_()
    if op == "rwkv7":
        kk = F.normalize(torch.randn(B, T, H, D, device=device), dim=-1)
        lr = torch.rand(B, T, H, D, device=device)
        w = -torch.rand(B, T, H, D, device=device).clamp_min(1e-3)
        return {"r": rand(B, T, H, D), "w": w.to(dtype).requires_grad_(), "k": rand(B, T, H, D, scale=0.5),
                "v": rand(B, T, H, D), "a": (-kk).to(dtype).requires_grad_(),
                "b": (kk * lr).to(dtype).requires_grad_()}
    k = F.normalize(torch.randn(B, T, H, D, device=device), dim=-1)
    if op == "titans":  # gates in the mixer's ranges: theta ~0.1, alpha ~0.01, a strong momentum eta ~0.9
        def gate(low, width):
            return (low + width * torch.rand(B, T, H, device=device)).to(dtype).requires_grad_()
        return {"q": rand(B, T, H, D), "k": k.to(dtype).requires_grad_(), "v": rand(B, T, H, D),
                "theta": gate(0.0, 0.2), "alpha": gate(0.0, 0.02), "eta": gate(0.85, 0.1),
                "w": torch.zeros(H, D, D, device=device).requires_grad_()}
    x = {"q": rand(B, T, H, D), "k": k.to(dtype).requires_grad_(), "v": rand(B, T, H, D),
         "beta": torch.rand(B, T, H, device=device).to(dtype).requires_grad_()}
    if op == "gated_delta_rule":
        x["g"] = (-torch.rand(B, T, H, device=device).clamp_min(1e-3)).float().requires_grad_()
    return x


def implementations(op: str, device: torch.device) -> dict[str, Callable]:
    """name -> function(inputs) -> output tensor, for the implementations present here."""
    on_gpu = device.type == "cuda"
    impls: dict[str, Callable] = {}
    if op == "rwkv7":
        naive = _optional("ltm.ops.rwkv7.naive", "naive_rwkv7")
        torch_chunk = _optional("ltm.ops.rwkv7.chunk", "chunk_rwkv7")
        ours = _optional("ltm.kernels.rwkv7", "triton_chunk_rwkv7") if on_gpu else None
        fla = _optional("fla.ops.rwkv7", "chunk_rwkv7") if on_gpu else None
        args = lambda x: (x["r"], x["w"], x["k"], x["v"], x["a"], x["b"])
        for name, fn in (("naive", naive), ("torch_chunk", torch_chunk), ("triton", ours), ("fla", fla)):
            if fn is not None:
                impls[name] = lambda x, fn=fn: fn(*args(x))[0]
        return impls
    if op == "titans":
        return _titans_implementations(on_gpu)
    naive = _optional("ltm.ops.delta_rule.naive", "naive_delta_rule")
    torch_chunk = _optional("ltm.ops.delta_rule.chunk", "chunk_delta_rule")
    ours = _optional("ltm.kernels.delta_rule", "triton_chunk_delta_rule") if on_gpu else None
    for name, fn in (("naive", naive), ("torch_chunk", torch_chunk), ("triton", ours)):
        if fn is not None:
            impls[name] = lambda x, fn=fn: fn(x["q"], x["k"], x["v"], x["beta"], x.get("g"))[0]
    if on_gpu and op == "delta_rule" and _optional("fla.ops.delta_rule", "chunk_delta_rule"):
        fla = _optional("fla.ops.delta_rule", "chunk_delta_rule")
        impls["fla"] = lambda x: fla(x["q"], x["k"], x["v"], x["beta"])[0]
    if on_gpu and op == "gated_delta_rule" and _optional("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"):
        fla_g = _optional("fla.ops.gated_delta_rule", "chunk_gated_delta_rule")
        impls["fla"] = lambda x: fla_g(x["q"], x["k"], x["v"], x["g"], x["beta"])[0]
    return impls


def _titans_implementations(on_gpu: bool) -> dict[str, Callable]:
    """The linear Titans memory's token loop, chunked form and (on a GPU) Triton kernel; fla's
    momentum delta rule computes it only at chunk size 1, `ltm.bench.titans_vs_fla` times that."""
    impls = {}
    entry = _optional("ltm.ops.titans", "titans_memory")
    kernels = (("naive", "naive"), ("torch_chunk", "torch")) + ((("triton", "triton"),) if on_gpu else ())
    for name, kernel in kernels if entry is not None else ():
        impls[name] = lambda x, kernel=kernel: entry(
            x["q"], x["k"], x["v"], x["theta"], x["alpha"], x["eta"], [x["w"]], kernel=kernel,
            chunk_size=TITANS_CHUNK, grad_clip=TITANS_CLIP)[0]
    return impls


def sdpa(x: dict) -> torch.Tensor:
    # (B, H, T, D) layout for SDPA
    q, k, v = (x[n].transpose(1, 2) for n in ("q", "k", "v"))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def floor_counts(op: str, B: int, T: int, H: int, D: int, itemsize: int, backward: bool,
                 chunk: int = 64) -> tuple[float, float]:
    """(bytes, FLOPs) no implementation can go below: every input read once and every output
    written once; FLOPs of the chunked form (delta rule: per chunk of C tokens, the products
    K K^T, L^-1 K, L^-1 V, Q K^T, P D at C^2 D each and W S, Q S, K^T D at C D^2 each; RWKV-7: the
    recurrence's 9 D^2 per token; SDPA: causal Q K^T and P V). The backward reads the inputs and
    the output gradient and writes every input gradient; its FLOPs are counted as twice the
    forward's."""
    n = B * T * H * D
    if op == "sdpa":
        fwd_bytes, bwd_bytes = 4 * n * itemsize, 8 * n * itemsize
        flops = 2.0 * B * H * T * T * D
    elif op == "rwkv7":
        fwd_bytes, bwd_bytes = 7 * n * itemsize, 13 * n * itemsize
        flops = 9.0 * B * T * H * D * D
    else:
        gates = {"gated_delta_rule": 2, "titans": 3}.get(op, 1) * B * T * H * itemsize
        fwd_bytes, bwd_bytes = 4 * n * itemsize + gates, 7 * n * itemsize + 2 * gates
        flops = 2.0 * B * T * H * (5 * chunk * D + 3 * D * D)
    if backward:
        return float(fwd_bytes + bwd_bytes), 3 * flops
    return float(fwd_bytes), flops


def _median_ms(fn: Callable, device: torch.device, warmup_ms: int, rep_ms: int,
               grads: list[torch.Tensor] | None = None) -> float:
    """do_bench's median on the GPU; on the CPU the host clock's, after one untimed call, over
    at least 3 calls and `rep_ms`."""
    if device.type == "cuda":
        return gpu_ms(fn, warmup_ms=warmup_ms, rep_ms=rep_ms, grad_to_none=grads)
    return host_ms(fn, 3, warmup=1, min_total_ms=rep_ms)


def floor_ms(op: str, B: int, T: int, H: int, D: int, itemsize: int, backward: bool,
             ceilings: dict) -> float:
    """The floor in ms: `floor_counts`' bytes over the measured copy bandwidth or its FLOPs over
    the measured matmul rate (`measure_ceilings`), whichever takes longer."""
    nbytes, flops = floor_counts(op, B, T, H, D, itemsize, backward)
    return 1e3 * max(nbytes / ceilings["copy_bytes_per_s"], flops / ceilings["matmul_flops_per_s"])


def measure_ceilings(device: torch.device, warmup_ms: int, rep_ms: int) -> dict:
    """Copy bandwidth (bytes read + written per second) and bf16 (float32 on CPU) matmul rate."""
    on_gpu = device.type == "cuda"
    src = torch.randn((1 << 28) if on_gpu else (1 << 22), device=device)
    dst = torch.empty_like(src)
    copy_ms = _median_ms(lambda: dst.copy_(src), device, warmup_ms, rep_ms)
    n = 8192 if on_gpu else 512
    dtype = torch.bfloat16 if on_gpu else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    mm_ms = _median_ms(lambda: a @ b, device, warmup_ms, rep_ms)
    return {"copy_bytes_per_s": 2 * src.numel() * src.element_size() / (copy_ms * 1e-3),
            "matmul_flops_per_s": 2.0 * n ** 3 / (mm_ms * 1e-3), "matmul_dtype": str(dtype)}


def _time_one(fn: Callable, x: dict, device, backward: bool, cfg: KernelBenchConfig) -> dict:
    """Median ms and peak memory (MiB above what the inputs hold) of one pass."""
    grads = [t for t in x.values() if t.requires_grad]
    if backward:
        out = fn(x)
        do = torch.randn_like(out)
        step = lambda: fn(x).backward(do)
    else:
        step = lambda: fn(x)
    # first call outside the timing: compilation and fla's autotuning
    step()
    peak = None
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    with torch.no_grad() if not backward else torch.enable_grad():
        ms = _median_ms(step, device, cfg.warmup_ms, cfg.rep_ms, grads)
    return {"ms": ms, "peak_mib": peak}


def _rows_for_shape(op, impls, shape, dtype, device, cfg, ceilings) -> list[dict]:
    B, T, H, D = shape
    x = make_inputs(op, B, T, H, D, dtype, device)
    rows, outputs = [], {}
    for name, fn in impls.items():
        try:
            with torch.no_grad():
                outputs[name] = fn(x).float()
        except (RuntimeError, ValueError, AssertionError, NotImplementedError):
            # an implementation that refuses these inputs (fla and float32) still gets its rows
            pass
        for backward in ((False, True) if cfg.backward else (False,)):
            floor = floor_ms("sdpa" if name == "sdpa" else op, B, T, H, D,
                             x["v"].element_size(), backward, ceilings)
            row = {"op": op, "impl": name, "B": B, "T": T, "H": H, "D": D,
                   "dtype": str(dtype).replace("torch.", ""), "pass": "fwd+bwd" if backward else "fwd",
                   "floor_ms": floor}
            try:
                timing = _time_one(fn, x, device, backward, cfg)
                row.update(timing, x_floor=timing["ms"] / floor)
            except (RuntimeError, ValueError, AssertionError, NotImplementedError) as err:
                # e.g. fla refuses float32 and, on some Triton versions, its gated backward
                row.update(ms=None, peak_mib=None, x_floor=None, error=str(err).splitlines()[0][:200])
            rows.append(row)
    # agreement with the reference implementation on the same inputs (fla where present)
    ref_name = "fla" if "fla" in outputs else "torch_chunk" if "torch_chunk" in outputs else None
    for row in rows:
        if ref_name and row["impl"] in outputs and row["impl"] not in ("sdpa", ref_name):
            a, b = outputs[row["impl"]], outputs[ref_name]
            row[f"rel_err_vs_{ref_name}"] = ((a - b).norm() / b.norm()).item()
    return rows


def run(config: KernelBenchConfig | None = None, device: str | None = None,
        verbose: bool = False) -> list[dict]:
    """Time every implementation at every configured shape; returns one dict per
    (op, implementation, shape, pass), with ratios to fla and to the floor. `verbose` prints each
    row as it is measured (a long GPU run shows progress even if it is cut short)."""
    cfg = config or KernelBenchConfig()
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, cfg.dtype)
    ceilings = measure_ceilings(dev, cfg.warmup_ms, cfg.rep_ms)
    if verbose:
        print(json.dumps(ceilings), flush=True)
    rows = []
    for op in cfg.ops:
        impls = {name: fn for name, fn in implementations(op, dev).items()
                 if not cfg.impls or name in cfg.impls}
        naive = impls.pop("naive", None)
        for shape in cfg.shapes:
            with_sdpa = impls
            if op == "delta_rule" and (not cfg.impls or "sdpa" in cfg.impls):
                with_sdpa = dict(impls, sdpa=sdpa)
            new = _rows_for_shape(op, with_sdpa, shape, dtype, dev, cfg, ceilings)
            _add_fla_ratios(new)
            rows += new
            if verbose:
                print(format_table(new), flush=True)
        # the token loop at a short length, beside the chunked forms at that same length (so
        # that its table row reads as a speed-up)
        B, _, H, D = cfg.shapes[0]
        short = {"naive": naive} if naive else {}
        for name in ("torch_chunk", "triton"):
            if short and name in impls:
                short[name] = impls[name]
        if short:
            new = _rows_for_shape(op, short, [B, cfg.naive_tokens, H, D], dtype, dev, cfg, ceilings)
            rows += [dict(r, impl=f"{r['impl']}@short") for r in new]
            if verbose:
                print(format_table([dict(r, x_fla=None) for r in rows[-len(new):]]), flush=True)
    _add_fla_ratios(rows)
    for row in rows:
        row.update({k: v for k, v in ceilings.items()})
    return rows


def _add_fla_ratios(rows: list[dict]) -> None:
    """x_fla = fla's time / this time (above 1: faster than fla), for rows that have an fla twin."""
    fla = {(r["op"], r["B"], r["T"], r["H"], r["D"], r["pass"]): r["ms"] for r in rows
           if r["impl"] == "fla" and r["ms"]}
    for r in rows:
        key = (r["op"], r["B"], r["T"], r["H"], r["D"], r["pass"])
        r["x_fla"] = fla[key] / r["ms"] if key in fla and r["ms"] else None


def format_table(rows: list[dict]) -> str:
    head = f"{'op':17} {'impl':15} {'B,T,H,D':17} {'pass':8} {'ms':>9} {'x_fla':>6} {'x_floor':>8} {'MiB':>8}"
    lines = [head]
    for r in rows:
        shape = f"{r['B']},{r['T']},{r['H']},{r['D']}"
        x_fla = f"{r['x_fla']:.2f}" if r["x_fla"] else "-"
        mib = f"{r['peak_mib']:.0f}" if r["peak_mib"] is not None else "-"
        if r["ms"] is None:
            lines.append(f"{r['op']:17} {r['impl']:15} {shape:17} {r['pass']:8} failed: {r['error']}")
            continue
        lines.append(f"{r['op']:17} {r['impl']:15} {shape:17} {r['pass']:8} {r['ms']:9.3f} {x_fla:>6} "
                     f"{r['x_floor']:8.1f} {mib:>8}")
    return "\n".join(lines)


def environment() -> dict:
    fla = _optional("fla", "__version__")
    return {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "triton": triton.__version__, "fla": fla}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="default gpu/results/kernels.json (--tune: gpu/results/kernel-table.json)")
    parser.add_argument("--shapes", type=str, default=None,
                        help="semicolon-separated B,T,H,D shapes (default: the GPU set, or a tiny CPU one)")
    parser.add_argument("--ops", type=str, default=None,
                        help=f"default {','.join(OPS)}; with --tune: see ltm.bench.tune")
    parser.add_argument("--impls", type=str, default="",
                        help=f"comma-separated subset of {','.join(IMPLS)} (default: all present)")
    parser.add_argument("--naive-tokens", type=int, default=None)
    parser.add_argument("--grid", action="store_true",
                        help="the issue-18 grid (GRID_SHAPES; RWKV7_GRID_SHAPES for rwkv7), ours and "
                             "fla only, with a per-shape table of x_fla and the ratios to the floor")
    parser.add_argument("--tune", action="store_true",
                        help="time the candidates of model.kernel auto and write its table (a GPU only)")
    args = parser.parse_args(argv)
    if args.tune:
        # ltm.bench.tune imports this module; loaded by name here, so that the benchmark stage,
        # which imports this module and never tunes, does not run it (its dvc.yaml deps are
        # exactly what it runs)
        importlib.import_module("ltm.bench.tune").command(args.ops, args.shapes, args.out)
        return
    on_gpu = torch.cuda.is_available()
    shapes = ([[int(n) for n in s.split(",")] for s in args.shapes.split(";")] if args.shapes
              else GRID_SHAPES if args.grid else GPU_SHAPES if on_gpu else [[1, 128, 2, 32]])
    impls = [name for name in args.impls.split(",") if name] or (["triton", "fla"] if args.grid else [])
    cfg = KernelBenchConfig(shapes=shapes, ops=(args.ops or ",".join(OPS)).split(","), impls=impls,
                            naive_tokens=args.naive_tokens or (512 if on_gpu else 64),
                            dtype="bfloat16" if on_gpu else "float32")
    print(json.dumps(environment()), flush=True)
    args.out = args.out or Path("gpu/results/kernels.json")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    # one op at a time, the JSON rewritten after each, so a run cut short keeps what it measured
    for op in cfg.ops:
        op_cfg = dataclasses.replace(cfg, ops=[op])
        if args.grid and op == "rwkv7" and not args.shapes:
            op_cfg = dataclasses.replace(op_cfg, shapes=RWKV7_GRID_SHAPES)
        rows += run(op_cfg, verbose=True)
        out = {**environment(), "config": dataclasses.asdict(cfg), "rows": rows}
        if args.grid:
            out["grid"] = grid_table(rows)
        args.out.write_text(json.dumps(out, indent=1))
    print(format_table(rows))
    if args.grid:
        print(format_grid(grid_table(rows)))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
