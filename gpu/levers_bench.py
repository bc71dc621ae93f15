"""Issue 21 in one run: the train stage's levers against the nanoGPT-class loop, measured together.

    python3 gpu/levers_bench.py OUT.json [--parts kernels,baseline,ablate,ttt,deltanet]
                                [--budget-s 520] [--seq-lens 2048,8192] [--tiny]

Parts, in order (each skipped, with a note, once --budget-s is spent):
  kernels   ltm.train.fused_ops's kernels against the plain PyTorch ops on odd shapes, forward and backward,
            float32 (bound 1e-5) and bfloat16 (bound 2e-2), relative max error
  baseline  gpu/gpt2_baseline.py's plain GPT-2-small loop (compiled, bf16, fused AdamW), T=1024;
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
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():  # before any Triton kernel is defined
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpt2_baseline  # noqa: E402
from source_checkout import commit  # noqa: E402

from ltm.ablation.protocol import ablate  # noqa: E402
from ltm.ablation.switches import AblateConfig, apply_switch, SWITCHABLE  # noqa: E402
from ltm.data.cache import cache_dir_of  # noqa: E402
from ltm.train.fused_ops import check_fused_against_references  # noqa: E402
from ltm.train.hardware import peak_flops  # noqa: E402
from ltm.data.batches import resolve_data  # noqa: E402
from ltm.train.time_to_target import score_ttt  # noqa: E402
from ltm.model.lm import LTM, ModelConfig  # noqa: E402
from ltm.params import apply_override, from_mapping, read_params  # noqa: E402
from ltm.train.settings import TrainConfig  # noqa: E402
from ltm.train.trainer import Trainer, run_training  # noqa: E402

PARTS = ("kernels", "baseline", "ablate", "ours", "ttt", "deltanet")
TINY_MODEL = ["model.vocab_size=2048", "model.n_layers=2", "model.d_model=64", "model.n_heads=2",
              "model.d_ff=128", "model.max_seq_len=512", "model.kernel=torch", "train.device=cpu",
              "train.batch_size=2", "train.seq_len=64", "train.opt.amp=off", "train.opt.tf32=false",
              "train.opt.compile=false", "train.opt.fused_adamw=false", "train.opt.workers=0",
              "train.opt.pin_memory=false", "ablate.warm_start_steps=2", "ablate.warmup=1",
              "ablate.steps=1", "ablate.repeats=2", "ablate.val_sequences=2"]



def gpu_config(path: str, tiny: bool, extra: list[str]) -> dict:
    params = read_params(path)
    for item in (TINY_MODEL if tiny else []) + extra:
        apply_override(params, item, "--set")
    params["train"]["data"] = resolve_data(params["train"].get("data", "cache"), cache_dir_of(params))
    return params


def flops_and_peak(params: dict, seq_len: int) -> tuple[float, float | None]:
    model_cfg = from_mapping(ModelConfig, params["model"], "model")
    vocab = max(model_cfg.vocab_size, 1)
    flops = LTM(dataclasses.replace(model_cfg, vocab_size=vocab)).flops_per_token(seq_len)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return flops, peak_flops(device, params["train"]["opt"]["amp"])


def baseline_args(args) -> dict:
    """The nanoGPT-class loop at the params' width, depth, heads, vocabulary, batch and length (its
    GELU MLP is 4 d wide: the same weights as a SwiGLU of 8/3 d)."""
    params = gpu_config(args.params, args.tiny, args.set)
    model, train = params["model"], params["train"]
    size = {"vocab": model["vocab_size"], "d": model["d_model"], "n_layers": model["n_layers"],
            "n_heads": model["n_heads"], "max_len": model["max_seq_len"]}
    if args.tiny:
        return dict(batch=2, seq_len=64, steps=3, warmup=1, compile=False, device="cpu", size=size)
    return dict(batch=train["batch_size"], seq_len=train["seq_len"], size=size)


def ablate_part(args, out: dict) -> None:
    params = gpu_config(args.params, args.tiny, args.set)
    cfg = from_mapping(AblateConfig, params["ablate"], "ablate")
    deadline = time.monotonic() + max(60.0, args.deadline - time.monotonic() - 30)
    result = ablate(cfg, {name: params.get(name) or {} for name in SWITCHABLE},
                    cache_dir_of(params), None, deadline=deadline)
    flops, peak = flops_and_peak(params, params["train"]["seq_len"])
    rows = result.table.to_dict("records")
    for row in rows:
        tps = row.get("tokens_per_s")
        row["mfu"] = round(flops * tps / peak, 4) if peak and tps == tps and tps else None
    out["ablate"] = {"rows": rows, "kept": result.info["kept"], "info": result.info,
                     "flops_per_token": flops}
    plain = out.get("baseline", {}).get("tokens_per_s")
    levers_on = rows[-1] if result.info["kept"] else rows[0]
    out["levers_on"] = {"tokens_per_s": levers_on["tokens_per_s"], "mfu": levers_on["mfu"],
                        "switches": result.info["kept"],
                        "x_nanogpt": levers_on["tokens_per_s"] / plain if plain else None}
    print(result.table[["switch", "verdict", "speedup", "tokens_per_s", "delta_val_loss",
                        "note"]].to_string(index=False))


def ttt_runs(args) -> list[dict]:
    """--ttt-runs "optimizer:batch:lr,...", or by default AdamW and Muon at --ttt-batch and
    --ttt-lr."""
    text = args.ttt_runs or f"adamw:{args.ttt_batch}:{args.ttt_lr},muon:{args.ttt_batch}:{args.ttt_lr}"
    runs = []
    for item in text.split(","):
        try:
            optimizer, batch, lr = item.split(":")
            runs.append({"optimizer": optimizer, "batch": int(batch), "lr": float(lr)})
        except ValueError:
            raise SystemExit(f"error: --ttt-runs: {item!r} is not optimizer:batch:lr") from None
        if optimizer not in ("adamw", "muon"):
            raise SystemExit(f"error: --ttt-runs: optimizer {optimizer!r}; expected adamw or muon")
    names = [r["optimizer"] for r in runs]
    for run in runs:  # short names where they are unique ("adamw", "muon"), else batch and lr too
        unique = names.count(run["optimizer"]) == 1
        run["name"] = run["optimizer"] if unique else f"{run['optimizer']} b{run['batch']} lr{run['lr']:g}"
    return runs


def ttt_config(args, run: dict, tiny: bool, cuda: bool) -> TrainConfig:
    """One run's train config: the tokens, warm-up and evaluation points in tokens of --ttt-steps
    steps at batch 32, whatever the run's batch."""
    per_32 = 32 / run["batch"]
    base = dict(steps=20 if tiny else max(1, round(args.ttt_steps * per_32)),
                batch_size=4 if tiny else run["batch"], seq_len=64 if tiny else 256,
                warmup_steps=2 if tiny else max(1, round(30 * per_32)), lr=run["lr"],
                min_lr=run["lr"] / 10,
                eval_every=5 if tiny else max(1, round(25 * per_32)), eval_batches=2 if tiny else 4,
                checkpoint_every=0,
                resume=False, log_every=10, timing_warmup=1,
                counterpart={"enabled": False}, seed=args.ttt_seed,
                opt={"amp": "bf16" if cuda else "off", "compile": args.ttt_compile, "workers": 0})
    if run["optimizer"] == "muon":
        base.update(optimizer="muon", muon_lr=args.ttt_muon_lr)
    return from_mapping(TrainConfig, base, "train")


def ttt_part(args, out: dict, tmp: str) -> None:
    """Optimisers (and batch sizes) on the token cache, the same tokens each; time to the final
    validation loss of AdamW's best run."""
    params = read_params(args.params)
    cache = cache_dir_of(params)
    if resolve_data("auto", cache) != "cache":
        out["ttt"] = {"skipped": f"no token cache in {cache}: carry data/cache"}
        return
    tiny = args.tiny
    model = ModelConfig(vocab_size=0, n_layers=2 if tiny else 4, d_model=64 if tiny else 256,
                        n_heads=2 if tiny else 4, max_seq_len=256, kernel="torch")
    cuda = torch.cuda.is_available()
    specs, runs = ttt_runs(args), {}
    for spec in specs:
        cfg = ttt_config(args, spec, tiny, cuda)
        workdir = str(Path(tmp) / spec["name"].replace(" ", "_"))
        if args.ttt_compile:
            # a short run of the same configuration first: the timed run then finds the compiled
            # graphs in the compiler's caches, so its clock measures training, not compilation
            begin = time.monotonic()
            run_training(model, dataclasses.replace(cfg, steps=3, eval_every=3), cache,
                         workdir + "-warm", progress=False)
            print(f"ttt {spec['name']}: compile caches warmed in {time.monotonic() - begin:.0f} s")
        result = run_training(model, cfg, cache, workdir, progress=False)
        runs[spec["name"]] = {**spec, "steps": cfg.steps,
                              "curve": [r for r in result.history if r["split"] == "val"],
                              "val_loss": result.metrics["val_loss"],
                              "tokens_per_s": result.metrics["tokens_per_s"]}
    out["ttt"] = {"runs": runs, "data": cache, "compile": args.ttt_compile, "muon_lr": args.ttt_muon_lr,
                  "seed": args.ttt_seed}
    score_ttt(out["ttt"], args.ttt_tolerance, args.ttt_targets)
    figure(runs, out["ttt"]["target_loss"], Path(args.out).with_suffix(".png"))
    print_ttt(out["ttt"])


def print_ttt(ttt: dict) -> None:
    for name, run in ttt["runs"].items():
        print(f"ttt {name}: final val {run['val_loss']:.4f} ({run['final_minus_reference']:+.4f}, "
              f"equal quality {run['equal_quality']}), to {ttt['target_loss']:.4f}: "
              f"{run['time_to_target_s']} s, {run['tokens_to_target']} tokens, "
              f"{run['tokens_per_s']:.0f} tokens/s, speedup {run['speedup']}, worst against an "
              f"AdamW run of equal quality {run['worst_vs_equal_adamw']}; fixed targets "
              + ", ".join(f"{t}: {x:.2f}x" if x else f"{t}: -" for t, x in run["fixed_targets"].items()))


def rescore(path: Path, tolerance: float, targets: list[float]) -> None:
    """--rescore: score_ttt again on a record's stored curves (a record from before a field
    existed, or other fixed targets); rewrites it, marking what was recomputed."""
    record = json.loads(path.read_text())
    if "ttt" not in record or "runs" not in record["ttt"]:
        raise SystemExit(f"error: {path}: no ttt runs to score")
    old_runs = {n: dict(r) for n, r in record["ttt"]["runs"].items()}
    for name, run in record["ttt"]["runs"].items():  # records before --ttt-runs named runs by optimiser
        run.setdefault("optimizer", "muon" if name.startswith("muon") else "adamw")
    score_ttt(record["ttt"], tolerance, targets)
    # every rescoring is listed, with the fields it added: a record says what it was measured with
    history = record["ttt"].get("rescored") or []
    history = [history] if isinstance(history, dict) else history
    record["ttt"]["rescored"] = history + [{"commit": commit(), "fields_absent_before": sorted(
        {k for r in record["ttt"]["runs"].values() for k in r} - {k for r in old_runs.values() for k in r})}]
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    print_ttt(record["ttt"])


def figure(runs: dict, target: float, path: Path) -> None:
    from ltm.report.figures import time_to_loss_figure
    time_to_loss_figure({name: run["curve"] for name, run in runs.items()}, target).savefig(path)


def throughput(params: dict, tmp: str, steps: int, warmup: int) -> float:
    model_cfg = from_mapping(ModelConfig, params["model"], "model")
    cfg = from_mapping(TrainConfig, dict(params["train"], steps=warmup + steps, resume=False),
                       "train")
    trainer = Trainer(model_cfg, cfg, cache_dir_of(params), tmp, progress=False)
    batches, timing = trainer.loader(), {"data_wait": 0.0}
    for _ in range(warmup):
        trainer.train_step(batches, timing)
    trainer.synchronize()
    begin = time.perf_counter()
    for _ in range(steps):
        trainer.train_step(batches, timing)
    trainer.synchronize()
    return steps * trainer.tokens_per_step() / (time.perf_counter() - begin)


def with_kept_levers(params: dict, out: dict) -> tuple[dict, list[str]]:
    """params with the switches the ablate part kept (not the optimiser: a speed comparison)."""
    kept = [k for k in out.get("ablate", {}).get("kept", []) if "optimizer" not in k]
    sections = {name: params[name] for name in SWITCHABLE}
    for switch in kept:
        sections = apply_switch(sections, switch, "kept")
    return {**params, **sections}, kept


def ours_part(args, out: dict, tmp: str) -> None:
    params, kept = with_kept_levers(gpu_config(args.params, args.tiny, args.set), out)
    tps = throughput(params, str(Path(tmp) / "ours"), 2 if args.tiny else 20, 1 if args.tiny else 5)
    flops, peak = flops_and_peak(params, params["train"]["seq_len"])
    plain = out.get("baseline", {}).get("tokens_per_s")
    out["ours"] = {"tokens_per_s": round(tps), "mfu": round(flops * tps / peak, 4) if peak else None,
                   "levers": kept, "x_nanogpt": round(tps / plain, 4) if plain else None}
    print(f"ours (the train stage's loop): {out['ours']}")


def deltanet_part(args, out: dict, tmp: str) -> None:
    rows = []
    lengths = ((128, 2), (256, 1)) if args.tiny else ((2048, 8), (8192, 2))
    for seq_len, batch in [(t, b) for t, b in lengths if not args.seq_lens or t in args.seq_lens]:
        for mixer in ("attention", "deltanet"):
            if time.monotonic() > args.deadline:
                rows.append({"seq_len": seq_len, "mixer": mixer, "skipped": "time budget spent"})
                continue
            params, kept = with_kept_levers(gpu_config(args.params, args.tiny, args.set + [
                f"model.mixer={mixer}", f"train.seq_len={seq_len}", f"train.batch_size={batch}"]), out)
            tps = throughput(params, str(Path(tmp) / f"{mixer}{seq_len}"), 2 if args.tiny else 8,
                             1 if args.tiny else 4)
            flops, peak = flops_and_peak(params, seq_len)
            rows.append({"seq_len": seq_len, "mixer": mixer, "tokens_per_s": round(tps),
                         "mfu": round(flops * tps / peak, 4) if peak else None, "levers": kept})
            print(f"deltanet part: T={seq_len} {mixer}: {tps:,.0f} tokens/s")
    for row in rows:
        attn = next((r for r in rows if r["seq_len"] == row["seq_len"] and r["mixer"] == "attention"
                     and "tokens_per_s" in r), None)
        if "tokens_per_s" in row and attn:
            row["x_attention"] = round(row["tokens_per_s"] / attn["tokens_per_s"], 3)
    out["deltanet"] = rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--params", default="configs/gpu-levers.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--parts", default=",".join(PARTS))
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
                        default=[4.3, 4.2, 4.1, 4.0, 3.97, 3.95], metavar="LOSS,...",
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
    args = parser.parse_args()
    if args.rescore:
        rescore(Path(args.out), args.ttt_tolerance, args.ttt_targets)
        return
    started = time.monotonic()
    args.deadline = started + args.budget_s
    parts = args.parts.split(",")
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise SystemExit(f"error: --parts: unknown {sorted(unknown)}; expected some of {list(PARTS)}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
           "torch": torch.__version__, "commit": commit(), "params": args.params,
           "overrides": args.set, "tiny": args.tiny, "skipped": []}
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for part in parts:
            if time.monotonic() > args.deadline:
                out["skipped"].append(part)
                continue
            begin = time.monotonic()
            if part == "kernels":
                out["kernels"] = check_fused_against_references(device)
                for row in out["kernels"]:
                    print(f"kernel {row['op']:14s} {row['dtype']:9s} {row['max_rel_error']:.2e} "
                          f"(bound {row['bound']:.0e}) {'ok' if row['ok'] else 'FAILED'}")
            elif part == "baseline":
                out["baseline"] = gpt2_baseline.measure(**baseline_args(args))
                print(f"nanoGPT-class loop: {out['baseline']}")
            elif part == "ablate":
                ablate_part(args, out)
            elif part == "ours":
                ours_part(args, out, tmp)
            elif part == "ttt":
                ttt_part(args, out, tmp)
            elif part == "deltanet":
                deltanet_part(args, out, tmp)
            out.setdefault("part_seconds", {})[part] = round(time.monotonic() - begin, 1)
            out["wall_s"] = round(time.monotonic() - started, 1)
            path.write_text(json.dumps(out, indent=1, default=str) + "\n")
    if "levers_on" in out:
        print(f"levers on: {out['levers_on']}")
    print(f"wrote {path} in {time.monotonic() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
