"""Issue 21 in one run: the train stage's levers against the nanoGPT-class loop, measured together.

    python3 gpu/levers_bench.py OUT.json [--parts kernels,baseline,ablate,ttt,deltanet]
                                [--budget-s 520] [--seq-lens 2048,8192] [--tiny]

Parts, in order (each skipped, with a note, once --budget-s is spent):
  kernels   ltm.train.fused_ops's kernels against the plain PyTorch ops on odd shapes, forward and backward,
            float32 (bound 1e-5) and bfloat16 (bound 2e-2), relative max error
  baseline  ltm.bench.gpt2_baseline's plain GPT-2-small loop (compiled, bf16, fused AdamW), T=1024;
            at the params' size and batch (--set model.d_model=2048 ... measures both wider)
  ablate    the ablate protocol on configs/gpu-levers.yaml: one row per lever with its verdict,
            tokens/s and MFU; the final row (every lever that passed) is "levers on"
  ours      the train stage's own loop (steps issued back to back, as a training run) at the
            params' configuration with the levers the ablate part kept, tokens/s and MFU beside
            the baseline part's loop: the protocol times each step between two synchronisations,
            which charges a step its launch latency; a training run overlaps it
  ttt       time to target on the token cache (data/cache, carried): a 4-layer model trained
            the same steps and lr schedule with AdamW and with Muon (bf16; eager, or with
            --ttt-compile compiled after a short run that warms the caches); the target is the
            final validation loss of AdamW's best run; seconds and tokens to it, and a figure OUT.png.
            --ttt-batch B (default 32) keeps the tokens, warm-up and evaluations of batch 32;
            --ttt-muon-lr Muon's peak lr (default 0.02), --ttt-lr AdamW's (default 3e-3);
            --ttt-targets: speedups to these fixed losses too; --ttt-tolerance: how much worse a
            final loss may be and count as equal quality; --rescore: OUT.json again from its curves
            --ttt-runs "adamw:16:3e-3,muon:64:1e-2" any list of optimizer:batch:lr (lr: AdamW's,
            or that of Muon's AdamW part), the same tokens each; the target is the lowest final
            loss of the AdamW runs, each run's speedup is against that run's time to it
  deltanet  tokens/s of attention and DeltaNet (kernel triton) at T=2048 and 8192, 16k tokens per
            step, with the levers the ablate part kept (train.optimizer left as it was)

Writes OUT.json after every part (a run cut short keeps what it measured) and prints tables.
--tiny: a tiny model on the CPU (Triton's interpreter), a minute or two; what it measures means
nothing, it checks that every part runs.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():  # before any Triton kernel is defined
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from source_checkout import commit  # noqa: E402

from ltm.ablation.switches import AblateConfig  # noqa: E402
from ltm.bench import levers  # noqa: E402
from ltm.train.settings import TrainConfig  # noqa: E402


def parse() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--params", default="configs/gpu-levers.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--parts", default=",".join(levers.PARTS))
    parser.add_argument("--budget-s", type=float, default=520.0)
    parser.add_argument("--ttt-steps", type=int, default=600)
    parser.add_argument("--ttt-batch", type=int, default=32,
                        help="time to target: sequences per step (steps scaled to the same tokens)")
    parser.add_argument("--ttt-muon-lr", type=float, default=0.02)
    parser.add_argument("--ttt-lr", type=float, default=3e-3,
                        help="AdamW's peak lr (Muon's AdamW part too), the minimum a tenth of it")
    parser.add_argument("--ttt-runs", default=None, metavar="OPT:BATCH:LR,...",
                        help="the runs of the ttt part; the AdamW run that ends lowest is the "
                             "reference (default: adamw and muon at --ttt-batch and --ttt-lr)")
    parser.add_argument("--ttt-tolerance", type=float, default=AblateConfig.loss_tolerance,
                        help="how much worse a run's final loss may be than the reference's and "
                             "count as equal quality (default: the ablate protocol's for an "
                             "approximate switch)")
    parser.add_argument("--ttt-targets", type=lambda text: [float(t) for t in text.split(",")],
                        default=levers.TTT_TARGETS, metavar="LOSS,...",
                        help="fixed validation losses: each run's speedup to each")
    parser.add_argument("--ttt-seed", type=int, default=TrainConfig.seed,
                        help="the runs' seed (weights and batches): one record per seed")
    parser.add_argument("--rescore", action="store_true",
                        help="OUT.json is a record: score its ttt part again from its curves "
                             "(--ttt-tolerance, --ttt-targets), rewrite it and exit")
    parser.add_argument("--ttt-compile", action="store_true",
                        help="time to target with torch.compile (model and Muon's step), caches warm")
    parser.add_argument("--tiny", action="store_true", help="a tiny model on the CPU")
    parser.add_argument("--seq-lens", type=lambda text: [int(t) for t in text.split(",")],
                        default=[], help="the deltanet part's lengths only (2048, 8192)")
    return parser.parse_args()


def figure(runs: dict, target: float, path: Path) -> None:
    """The ttt part's validation curves against time, with the target, to `path`. Imported here,
    as before the move: only the ttt part needs the report's plotting stack."""
    from ltm.report.figures import time_to_loss_figure
    time_to_loss_figure({name: run["curve"] for name, run in runs.items()}, target).savefig(path)


def main() -> None:
    args = parse()
    if args.rescore:
        levers.rescore(Path(args.out), args.ttt_tolerance, args.ttt_targets, commit)
        return
    started = time.monotonic()
    fields = {f.name for f in dataclasses.fields(levers.Levers)}
    opts = levers.Levers(**{k: v for k, v in vars(args).items() if k in fields},
                         deadline=started + args.budget_s)
    parts = args.parts.split(",")
    levers.check_parts(parts)
    out = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
           "torch": torch.__version__, "commit": commit(), "params": args.params,
           "overrides": args.set, "tiny": args.tiny, "skipped": []}
    path = Path(args.out)
    levers.run_parts(opts, parts, out, path, started, figure)
    print(f"wrote {path} in {time.monotonic() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
