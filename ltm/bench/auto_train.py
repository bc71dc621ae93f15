"""Training tokens/s of the GPU profile's model (configs/gpu.yaml) per model.kernel: ours, fla and
auto, at a few sequence lengths, all in one process (eager, bf16 autocast, fused AdamW: the
kernels' difference, not the compiler's).

    python -m ltm.bench.auto_train [--mixer deltanet] [--seq-lens 2048 8192]
        [--kernels triton fla auto] [--heads 6] [--steps 10] [--warmup 3] [--out F.json]

Each step holds 16,384 tokens (gpu/train.sh's batch 8 at T = 2048, 2 at 8192). --heads 6 makes
the head dim 128 (d_model 768), the only one at which fla as installed hands the gated delta rule
to FlashQLA; the profile's 12 heads (D = 64) never reach it. The DeltaNet here is already the gated
one (there is no ungated DeltaNet model). Under auto the table is LTM_AUTO_TABLE's, else the
shipped one for the device (`ltm.ops.auto`); the choices auto made are printed and written. A row:
ms per step (`ltm.bench.timing.per_call_ms`: steps back to back after the warm-up steps, whose
first compiles ours and runs fla's autotuning), tokens/s and the ratio to the first kernel, or
the error's first line (fla 0.6.0 refuses its gated backward on Hopper with Triton < 3.7.1 where
FlashQLA does not take the call).
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Callable

import torch

from ltm.bench import profile_train
from ltm.bench.provenance import commit, version_of
from ltm.bench.timing import per_call_ms
from ltm.ops.auto import TABLE_ENV, chosen, enabled_backends

TOKENS_PER_STEP = 16384
# (mixer, model overrides) -> (model, optimizer), on the device the timing runs on
Build = Callable[[str, dict], tuple[torch.nn.Module, torch.optim.Optimizer]]


def measure(kernels: list[str], seq_lens: list[int], *, mixer: str, heads: int,
            time_step: Callable[[Callable[[], None]], float], build: Build = profile_train.build,
            step: Callable = profile_train.step) -> list[dict]:
    """One row per (T, kernel): ms per training step by `time_step` (ms per call of the step it
    is given) and tokens/s, or the error that stopped it; the first kernel is the ratios' base."""
    rows = []
    for T in seq_lens:
        B = max(1, TOKENS_PER_STEP // T)
        for kernel in kernels:
            row = {"mixer": mixer, "kernel": kernel, "heads": heads, "B": B, "T": T}
            try:
                model, opt = build(mixer, {"kernel": kernel, "n_heads": heads, "max_seq_len": T})
                device = next(model.parameters()).device
                idx = torch.randint(0, model.cfg.vocab_size, (B, T), device=device)
                row["ms_per_step"] = time_step(lambda: step(model, opt, idx))
                row["tokens_per_s"] = B * T / (row["ms_per_step"] / 1e3)
                del model, opt, idx
            except Exception as err:  # a kernel that cannot train this model still gets its row
                row["error"] = f"{type(err).__name__}: " + (str(err).splitlines() or [""])[0][:200]
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            print(json.dumps(row), flush=True)
            rows.append(row)
    base = {r["T"]: r.get("tokens_per_s") for r in rows if r["kernel"] == kernels[0]}
    for r in rows:
        if r.get("tokens_per_s") and base.get(r["T"]):
            r[f"x_{kernels[0]}"] = r["tokens_per_s"] / base[r["T"]]
    return rows


def format_rows(rows: list[dict], choices: list[dict]) -> str:
    """The rows as one table, then what auto chose per op and class."""
    ratio = next((k for r in rows for k in r if k.startswith("x_")), "x_first")
    lines = [f"{'kernel':8} {'T':>6} {'B':>3} {'ms/step':>9} {'tokens/s':>10} {ratio:>9}"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['kernel']:8} {r['T']:>6} {r['B']:>3} failed: {r['error']}")
            continue
        x = f"{r[ratio]:.3f}" if r.get(ratio) else "-"
        lines.append(f"{r['kernel']:8} {r['T']:>6} {r['B']:>3} {r['ms_per_step']:>9.1f} "
                     f"{r['tokens_per_s']:>10,.0f} {x:>9}")
    for c in choices:
        lines.append(f"auto: {c['op']} {c['pass']} {c['dtype']} D{c['D']} T{c['T']} BH/SM "
                     f"{c['bh_per_sm']}: {c['impl']} ({c['why']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mixer", default="deltanet")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--kernels", nargs="+", default=["triton", "fla", "auto"])
    parser.add_argument("--heads", type=int, default=6, help="6: head dim 128 at d_model 768")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("auto_train: needs a CUDA GPU "
                         "(it times training steps of the GPU profile)")
    sync = torch.cuda.synchronize
    rows = measure(args.kernels, args.seq_lens, mixer=args.mixer, heads=args.heads,
                   time_step=lambda fn: per_call_ms(fn, args.steps, warmup=args.warmup, sync=sync))
    print(format_rows(rows, chosen()))
    if args.out:
        env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "triton": version_of("triton"), "fla": version_of("fla"),
               "fla_backends": enabled_backends(), "commit": commit(short=True),
               "kernel_table": os.environ.get(TABLE_ENV), "steps": args.steps,
               "warmup": args.warmup}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({**env, "rows": rows, "kernel_choices": chosen()}, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
