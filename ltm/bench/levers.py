"""Issue 21's measurements, the train stage's levers against the nanoGPT-class loop (gpu/levers_bench.py
is the command and says what each part measures): the kernels' checks, the ablate protocol with
MFU per lever, the train stage's own loop with the kept levers, time to target per optimiser
(`ltm.train.time_to_target`) and DeltaNet's throughput against attention.

The nanoGPT-class loop is `ltm.bench.gpt2_baseline`'s. The time-to-loss figure
(`ltm.report.figures`, a layer above this one) is the command's: `run_parts` takes it as a
callable.
"""
from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from ltm.ablation.protocol import ablate
from ltm.bench import gpt2_baseline
from ltm.bench.timing import per_call_ms
from ltm.ablation.switches import SWITCHABLE, AblateConfig, apply_switch
from ltm.data.batches import resolve_data
from ltm.data.cache import cache_dir_of
from ltm.model.lm import LTM, ModelConfig
from ltm.params import apply_override, from_mapping, read_params
from ltm.train.fused_ops import check_fused_against_references
from ltm.train.hardware import peak_flops
from ltm.train.settings import TrainConfig
from ltm.train.time_to_target import score_ttt
from ltm.train.trainer import Trainer, run_training

PARTS = ("kernels", "baseline", "ablate", "ours", "ttt", "deltanet")
TINY_MODEL = ["model.vocab_size=2048", "model.n_layers=2", "model.d_model=64", "model.n_heads=2",
              "model.d_ff=128", "model.max_seq_len=512", "model.kernel=torch", "train.device=cpu",
              "train.batch_size=2", "train.seq_len=64", "train.opt.amp=off", "train.opt.tf32=false",
              "train.opt.compile=false", "train.opt.fused_adamw=false", "train.opt.workers=0",
              "train.opt.pin_memory=false", "ablate.warm_start_steps=2", "ablate.warmup=1",
              "ablate.steps=1", "ablate.repeats=2", "ablate.val_sequences=2"]
TTT_TARGETS = [4.3, 4.2, 4.1, 4.0, 3.97, 3.95]


@dataclasses.dataclass
class Levers:
    """A run's settings, the command's arguments (gpu/levers_bench.py --help), and `deadline`
    (time.monotonic) after which no part starts and the deltanet part takes no new row."""
    out: str
    params: str = "configs/gpu-levers.yaml"
    set: list = dataclasses.field(default_factory=list)
    tiny: bool = False
    deadline: float = float("inf")
    seq_lens: list = dataclasses.field(default_factory=list)
    ttt_steps: int = 600
    ttt_batch: int = 32
    ttt_muon_lr: float = 0.02
    ttt_lr: float = 3e-3
    ttt_runs: str | None = None
    ttt_tolerance: float = AblateConfig.loss_tolerance
    ttt_targets: list = dataclasses.field(default_factory=lambda: list(TTT_TARGETS))
    ttt_seed: int = TrainConfig.seed
    ttt_compile: bool = False


def gpu_config(path: str, tiny: bool, extra: list[str]) -> dict:
    """The params at `path` with the tiny model's overrides (--tiny), then `extra`'s, and the
    data source resolved."""
    params = read_params(path)
    for item in (TINY_MODEL if tiny else []) + extra:
        apply_override(params, item, "--set")
    params["train"]["data"] = resolve_data(params["train"].get("data", "cache"), cache_dir_of(params))
    return params


def flops_and_peak(params: dict, seq_len: int) -> tuple[float, float | None]:
    """FLOPs per token of the params' model and the device's peak rate (None where unknown): MFU's
    two sides."""
    model_cfg = from_mapping(ModelConfig, params["model"], "model")
    vocab = max(model_cfg.vocab_size, 1)
    flops = LTM(dataclasses.replace(model_cfg, vocab_size=vocab)).flops_per_token(seq_len)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return flops, peak_flops(device, params["train"]["opt"]["amp"])


def baseline_args(opts: Levers) -> dict:
    """The nanoGPT-class loop at the params' width, depth, heads, vocabulary, batch and length (its
    GELU MLP is 4 d wide: the same weights as a SwiGLU of 8/3 d)."""
    params = gpu_config(opts.params, opts.tiny, opts.set)
    model, train = params["model"], params["train"]
    size = {"vocab": model["vocab_size"], "d": model["d_model"], "n_layers": model["n_layers"],
            "n_heads": model["n_heads"], "max_len": model["max_seq_len"]}
    if opts.tiny:
        return dict(batch=2, seq_len=64, steps=3, warmup=1, compile=False, device="cpu", size=size)
    return dict(batch=train["batch_size"], seq_len=train["seq_len"], size=size)


def kernels_part(out: dict, device: str) -> None:
    """ltm.train.fused_ops's kernels against the plain ops, printed and recorded."""
    out["kernels"] = check_fused_against_references(device)
    for row in out["kernels"]:
        print(f"kernel {row['op']:14s} {row['dtype']:9s} {row['max_rel_error']:.2e} "
              f"(bound {row['bound']:.0e}) {'ok' if row['ok'] else 'FAILED'}")


def ablate_part(opts: Levers, out: dict) -> None:
    """The ablate protocol on the params: a row per lever with MFU, and "levers on" (the last
    row when some lever was kept) against the baseline part's tokens/s."""
    params = gpu_config(opts.params, opts.tiny, opts.set)
    cfg = from_mapping(AblateConfig, params["ablate"], "ablate")
    deadline = time.monotonic() + max(60.0, opts.deadline - time.monotonic() - 30)
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


def ttt_runs(opts: Levers) -> list[dict]:
    """--ttt-runs "optimizer:batch:lr,...", or by default AdamW and Muon at --ttt-batch and
    --ttt-lr."""
    text = opts.ttt_runs or f"adamw:{opts.ttt_batch}:{opts.ttt_lr},muon:{opts.ttt_batch}:{opts.ttt_lr}"
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


def ttt_config(opts: Levers, run: dict, tiny: bool, cuda: bool) -> TrainConfig:
    """One run's train config: the tokens, warm-up and evaluation points in tokens of --ttt-steps
    steps at batch 32, whatever the run's batch."""
    per_32 = 32 / run["batch"]
    base = dict(steps=20 if tiny else max(1, round(opts.ttt_steps * per_32)),
                batch_size=4 if tiny else run["batch"], seq_len=64 if tiny else 256,
                warmup_steps=2 if tiny else max(1, round(30 * per_32)), lr=run["lr"],
                min_lr=run["lr"] / 10,
                eval_every=5 if tiny else max(1, round(25 * per_32)), eval_batches=2 if tiny else 4,
                checkpoint_every=0,
                resume=False, log_every=10, timing_warmup=1,
                counterpart={"enabled": False}, seed=opts.ttt_seed,
                opt={"amp": "bf16" if cuda else "off", "compile": opts.ttt_compile, "workers": 0})
    if run["optimizer"] == "muon":
        base.update(optimizer="muon", muon_lr=opts.ttt_muon_lr)
    return from_mapping(TrainConfig, base, "train")


def ttt_part(opts: Levers, out: dict, tmp: str, draw: Callable[[dict, float, Path], None]) -> None:
    """Optimisers (and batch sizes) on the token cache, the same tokens each; time to the final
    validation loss of AdamW's best run; `draw(runs, target, path)` draws the curves to OUT.png."""
    params = read_params(opts.params)
    cache = cache_dir_of(params)
    if resolve_data("auto", cache) != "cache":
        out["ttt"] = {"skipped": f"no token cache in {cache}: carry data/cache"}
        return
    tiny = opts.tiny
    model = ModelConfig(vocab_size=0, n_layers=2 if tiny else 4, d_model=64 if tiny else 256,
                        n_heads=2 if tiny else 4, max_seq_len=256, kernel="torch")
    cuda = torch.cuda.is_available()
    runs = {}
    for spec in ttt_runs(opts):
        cfg = ttt_config(opts, spec, tiny, cuda)
        workdir = str(Path(tmp) / spec["name"].replace(" ", "_"))
        if opts.ttt_compile:
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
    out["ttt"] = {"runs": runs, "data": cache, "compile": opts.ttt_compile, "muon_lr": opts.ttt_muon_lr,
                  "seed": opts.ttt_seed}
    score_ttt(out["ttt"], opts.ttt_tolerance, opts.ttt_targets)
    draw(runs, out["ttt"]["target_loss"], Path(opts.out).with_suffix(".png"))
    print_ttt(out["ttt"])


def print_ttt(ttt: dict) -> None:
    """One line per time-to-target run: final loss, time and tokens to target, speedups."""
    for name, run in ttt["runs"].items():
        print(f"ttt {name}: final val {run['val_loss']:.4f} ({run['final_minus_reference']:+.4f}, "
              f"equal quality {run['equal_quality']}), to {ttt['target_loss']:.4f}: "
              f"{run['time_to_target_s']} s, {run['tokens_to_target']} tokens, "
              f"{run['tokens_per_s']:.0f} tokens/s, speedup {run['speedup']}, worst against an "
              f"AdamW run of equal quality {run['worst_vs_equal_adamw']}; fixed targets "
              + ", ".join(f"{t}: {x:.2f}x" if x else f"{t}: -" for t, x in run["fixed_targets"].items()))


def rescore(path: Path, tolerance: float, targets: list[float], commit: Callable[[], str | None]) -> None:
    """--rescore: score_ttt again on a record's stored curves (a record from before a field
    existed, or other fixed targets); rewrites it, marking what was recomputed and at which
    `commit()`."""
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


def throughput(params: dict, tmp: str, steps: int, warmup: int) -> float:
    """Tokens/s of the train stage's own loop at `params`: steps issued back to back, as in a
    training run, between two synchronisations after `warmup` untimed steps."""
    model_cfg = from_mapping(ModelConfig, params["model"], "model")
    cfg = from_mapping(TrainConfig, dict(params["train"], steps=warmup + steps, resume=False),
                       "train")
    trainer = Trainer(model_cfg, cfg, cache_dir_of(params), tmp, progress=False)
    batches, step_timing = trainer.loader(), {"data_wait": 0.0}
    step_ms = per_call_ms(lambda: trainer.train_step(batches, step_timing), steps, warmup=warmup,
                          sync=trainer.synchronize)
    return trainer.tokens_per_step() / (step_ms / 1e3)


def with_kept_levers(params: dict, out: dict) -> tuple[dict, list[str]]:
    """params with the switches the ablate part kept (not the optimiser: a speed comparison)."""
    kept = [k for k in out.get("ablate", {}).get("kept", []) if "optimizer" not in k]
    sections = {name: params[name] for name in SWITCHABLE}
    for switch in kept:
        sections = apply_switch(sections, switch, "kept")
    return {**params, **sections}, kept


def ours_part(opts: Levers, out: dict, tmp: str) -> None:
    """The train stage's loop with the kept levers: tokens/s, MFU, and x_nanogpt against the
    baseline part's loop."""
    params, kept = with_kept_levers(gpu_config(opts.params, opts.tiny, opts.set), out)
    tps = throughput(params, str(Path(tmp) / "ours"), 2 if opts.tiny else 20, 1 if opts.tiny else 5)
    flops, peak = flops_and_peak(params, params["train"]["seq_len"])
    plain = out.get("baseline", {}).get("tokens_per_s")
    out["ours"] = {"tokens_per_s": round(tps), "mfu": round(flops * tps / peak, 4) if peak else None,
                   "levers": kept, "x_nanogpt": round(tps / plain, 4) if plain else None}
    print(f"ours (the train stage's loop): {out['ours']}")


def deltanet_part(opts: Levers, out: dict, tmp: str) -> None:
    """Tokens/s and MFU of attention and DeltaNet per length with the kept levers, and DeltaNet's
    ratio to attention (x_attention)."""
    rows = []
    lengths = ((128, 2), (256, 1)) if opts.tiny else ((2048, 8), (8192, 2))
    for seq_len, batch in [(t, b) for t, b in lengths if not opts.seq_lens or t in opts.seq_lens]:
        for mixer in ("attention", "deltanet"):
            if time.monotonic() > opts.deadline:
                rows.append({"seq_len": seq_len, "mixer": mixer, "skipped": "time budget spent"})
                continue
            params, kept = with_kept_levers(gpu_config(opts.params, opts.tiny, opts.set + [
                f"model.mixer={mixer}", f"train.seq_len={seq_len}", f"train.batch_size={batch}"]), out)
            tps = throughput(params, str(Path(tmp) / f"{mixer}{seq_len}"), 2 if opts.tiny else 8,
                             1 if opts.tiny else 4)
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


def check_parts(parts: list[str]) -> None:
    """Exit with the list of known parts if --parts names another."""
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise SystemExit(f"error: --parts: unknown {sorted(unknown)}; expected some of {list(PARTS)}")


def run_parts(opts: Levers, parts: list[str], out: dict, path: Path, started: float,
              draw: Callable[[dict, float, Path], None]) -> None:
    """The parts in order, each skipped once the deadline has passed; `out` (the record) gets
    each part's result and seconds (wall_s since `started`) and is rewritten to `path` after
    every part, so a run cut short keeps what it measured. `draw` draws the ttt part's figure:
    the command's (see the module docstring)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for part in parts:
            if time.monotonic() > opts.deadline:
                out["skipped"].append(part)
                continue
            begin = time.monotonic()
            if part == "kernels":
                kernels_part(out, device)
            elif part == "baseline":
                out["baseline"] = gpt2_baseline.measure(**baseline_args(opts))
                print(f"nanoGPT-class loop: {out['baseline']}")
            elif part == "ablate":
                ablate_part(opts, out)
            elif part == "ours":
                ours_part(opts, out, tmp)
            elif part == "ttt":
                ttt_part(opts, out, tmp, draw)
            elif part == "deltanet":
                deltanet_part(opts, out, tmp)
            out.setdefault("part_seconds", {})[part] = round(time.monotonic() - begin, 1)
            out["wall_s"] = round(time.monotonic() - started, 1)
            path.write_text(json.dumps(out, indent=1, default=str) + "\n")
    if "levers_on" in out:
        print(f"levers on: {out['levers_on']}")
