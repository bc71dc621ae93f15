"""Why the Titans memory's sequential kernels take what they take (issue 56): Nsight Compute on one
forward+backward of the memory, its kernels only, with the stall reasons of their warps.

The per-chunk time of the deep memory's state kernels did not change between 96 programs (8 x
2048 x 12 x 64) and 24 (2 x 8192 x 12 x 64) on an H100 (LOG.md, 2026-12-07, ninth session): each
program waits on its own chain, not on the memory system shared by all. What it waits on (global
loads, barriers, the tensor cores, spilled registers) is what this asks ncu.

    python gpu/ncu_titans.py OUT_DIR [--shapes 8,2048,12,64 2,8192,12,64] [--depths 2 1]

Per shape and depth: one warm-up forward+backward (Triton compiles), then one that ncu
profiles; raw CSV to OUT_DIR/ncu-<depth>-<shape>.csv, and a summary of every profiled kernel
(duration, throughput, occupancy, registers, spills, the warp stall reasons per issued
instruction, largest first) to OUT_DIR/ncu-titans.json. `--target` is the profiled process (what
ncu runs).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

# the memory's own kernels: the sequential state passes and, for the deep memory, the parallel ones
# too, and how many of them one forward+backward launches (none is autotuned: the warm-up
# launches exactly as many, which ncu skips)
KERNELS = {1: ("regex:_titans_(states|bwd_state)_kernel", 2), 2: ("regex:_deep_", 4)}
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "SchedulerStats",
            "MemoryWorkloadAnalysis")
STALLS = r"regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
KEPT = ("Duration", "Memory Throughput", "DRAM Throughput", "L1/TEX Cache Throughput",
        "L2 Cache Throughput", "Compute (SM) Throughput", "Registers Per Thread",
        "Achieved Occupancy", "Warp Cycles Per Issued Instruction", "Issue Slots Busy",
        "No Eligible", "L1/TEX Hit Rate", "L2 Hit Rate", "Local Memory Spilling Requests",
        "Dynamic Shared Memory Per Block", "Static Shared Memory Per Block")


def target(shape: str, depth: int) -> None:
    """The profiled process: a warm-up forward+backward, then the one ncu profiles."""
    # imported here: the parent process (and the parser's test) needs neither torch nor a GPU;
    # titans_profile sits beside this file, on the path of the profiled process
    import torch
    from titans_profile import memory_call

    from ltm.bench.titans_depths import make_inputs, memory_weights
    from ltm.model.config import CHUNK_AUTO

    B, T, H, D = (int(n) for n in shape.split(","))
    x = make_inputs(B, T, H, D, torch.bfloat16, "cuda")
    run = memory_call(x, memory_weights(depth, H, D, "cuda"), CHUNK_AUTO[depth])
    for _ in range(2):
        run()
    torch.cuda.synchronize()


def parse(csv_text: str) -> list[dict]:
    """ncu's `--page details --csv` rows, one dict per profiled kernel: its name, grid, block, the
    KEPT metrics as "value unit" and the stall reasons (cycles per issued instruction), largest
    first. Lines that are not CSV rows (ncu's ==PROF== notes, the program's prints) are skipped."""
    rows = csv.DictReader(line for line in csv_text.splitlines() if line.startswith('"'))
    kernels: dict[str, dict] = {}
    for row in rows:
        k = kernels.setdefault(row["ID"], {"kernel": row["Kernel Name"].split("(")[0],
                                           "grid": row["Grid Size"], "block": row["Block Size"],
                                           "metrics": {}, "stalls": {}})
        name, value, unit = row["Metric Name"], row["Metric Value"], row.get("Metric Unit", "")
        if name.startswith("smsp__average_warps_issue_stalled_"):
            reason = name.removeprefix("smsp__average_warps_issue_stalled_")
            k["stalls"][reason.removesuffix("_per_issue_active.ratio")] = float(
                value.replace(",", "") or 0)
        elif name in KEPT:
            k["metrics"][name] = f"{value} {unit}".strip()
    for k in kernels.values():
        k["stalls"] = dict(sorted(k["stalls"].items(), key=lambda kv: -kv[1])[:8])
    return list(kernels.values())


def profile(out_dir: Path, shape: str, depth: int, ncu: str) -> list[dict]:
    kernels, launches = KERNELS[depth]
    command = [ncu, "-k", kernels, "--launch-skip", str(launches), "--launch-count", str(launches),
               "--clock-control", "none", "--csv", "--page", "details",
               *(a for s in SECTIONS for a in ("--section", s)), "--metrics", STALLS,
               sys.executable, __file__, "--target", shape, str(depth)]
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ | {
        "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    raw = out_dir / f"ncu-{depth}-{shape.replace(',', 'x')}.csv"
    raw.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        print(f"ncu {shape} depth {depth}: rc {done.returncode}: {done.stderr.strip()[-300:]}")
        return []
    return parse(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?")
    parser.add_argument("--shapes", nargs="+", default=["8,2048,12,64", "2,8192,12,64"])
    parser.add_argument("--depths", nargs="+", type=int, default=[2, 1], choices=[1, 2])
    parser.add_argument("--target", nargs=2, metavar=("SHAPE", "DEPTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.target:
        return target(args.target[0], int(args.target[1]))
    if not args.out_dir:
        parser.error("OUT_DIR is required")
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = []
    for depth in args.depths:
        for shape in args.shapes:
            for k in profile(out_dir, shape, depth, ncu):
                report.append({"shape": shape, "depth": depth, **k})
                print(json.dumps({"shape": shape, "depth": depth, "kernel": k["kernel"],
                                  "duration": k["metrics"].get("Duration"),
                                  "stalls": list(k["stalls"].items())[:3]}), flush=True)
    (out_dir / "ncu-titans.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
