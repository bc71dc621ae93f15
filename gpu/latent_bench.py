"""Latent thoughts' training cost on one GPU (issue 15): the inner loop eager against a compiled
inner step, against a compiled plain training step.

    python gpu/latent_bench.py OUT.json [--budget SECONDS] [--repeats N]
    python gpu/latent_bench.py OUT.json --tiny     # the same sections, tiny, on the CPU

The GPU profile's model (configs/gpu.yaml: attention, 12 layers, d_model 768, 12 heads, vocab
50304) at T=1024, batch 16, bf16 autocast, TF32, fused AdamW, random tokens and weights; the
latent model adds n_latent 8 thoughts per layer and fits them with 16 inner steps (the authors'
recipe, train.latent's defaults). Every timed step runs first untimed (compilation); the time is
the median of --repeats. Sections, cheapest first; OUT.json is rewritten after each, so a run cut
short keeps what it measured, and a section whose turn comes after --budget seconds (default
330; compiling the three graphs takes most of it) is listed as skipped:

1. plain training step (forward, backward, AdamW), eager and compiled: ms, tokens/s
2. one inner step (forward, backward to mu and log sigma^2, the update of q), eager
3. the whole latent training step, decoder compiled, inner loop eager: ms, tokens/s
4. one inner step compiled (ltm.latent.posterior.PosteriorFitter compile=True: the NLL's forward and
   backward to z compiled, the decoder frozen, the head's loss through ltm.model.cross_entropy)
5. the whole latent step with the compiled inner step: ms, tokens/s
6. the top operations of one compiled inner step by GPU time (torch.profiler)
7. one inner step compiled with CUDA graphs (mode="reduce-overhead"; CUDA only)
8. the whole latent step with that inner step

x_plain: ms / the compiled plain step's ms (the eager plain step's in --tiny runs without
compile). Needs torch with CUDA; --tiny runs on the CPU in a minute or two (compile included;
--no-compile for seconds).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import statistics
import time
from pathlib import Path

from source_checkout import ROOT  # noqa: E402  (the checkout's ltm, installed or not)

import torch  # noqa: E402


from ltm.latent.posterior import (LatentConfig, PosteriorFitter, decoder_fitter, latent_shape,  # noqa: E402
                        sequence_nll, step_sizes)
from ltm.train.objective import LossModel  # noqa: E402
from ltm.model.lm import LTM, ModelConfig  # noqa: E402
from ltm.params import from_mapping, read_params  # noqa: E402

SIZES = dict(batch=16, seq_len=1024, n_latent=8, inner_steps=16)
TINY_SIZES = dict(batch=2, seq_len=32, n_latent=2, inner_steps=2)
TINY_MODEL = dict(vocab_size=256, n_layers=2, d_model=64, n_heads=2, max_seq_len=64,
                  kernel="torch", d_ff=None)
COLUMNS = ("case", "impl", "ms", "tokens_per_s", "x_plain", "first_call_s", "error")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, repeats: int) -> tuple[float, float]:
    """(median ms of fn() over repeats, seconds of the first, untimed call: compilation)."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times), first


def train_step(step_model, model: torch.nn.Module, x, y, device: torch.device, amp):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = step_model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def inner_step(fitter, cfg: ModelConfig, latent: LatentConfig, x, y, device: torch.device, amp):
    """One inner step on a posterior held across calls (as in training, q's state in place)."""
    shape = latent_shape(cfg, x.shape[0])
    mu = 0.01 * torch.randn(shape, device=device)
    log_var = torch.full(shape, latent.log_var_init, device=device)
    eps = torch.randn(shape, device=device)
    state = tuple(torch.zeros(shape, device=device) for _ in range(4))
    lr = step_sizes(latent, latent.steps, device)[0]
    t = torch.ones((), device=device)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            fitter._step((x, y), mu, log_var, eps, state, t, lr)
    return step


def top_kernels(fn, device: torch.device, steps: int = 3, top: int = 15) -> list[dict]:
    """The `top` operations of `steps` calls of fn by self device time (CPU time on the CPU):
    name, ms per call, share of the total."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            fn()
        sync(device)
    attr = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, attr, 0) > 0]
    total = sum(getattr(e, attr) for e in events) or 1.0
    events.sort(key=lambda e: -getattr(e, attr))
    rows = [{"name": e.key[:90], "ms_per_call": getattr(e, attr) / 1e3 / steps,
             "share": getattr(e, attr) / total} for e in events[:top]]
    for r in rows:
        print(f"    {r['ms_per_call']:8.3f} ms {100 * r['share']:5.1f}%  {r['name']}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--budget", type=float, default=330.0,
                        help="seconds after which no further section starts")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="tiny sizes on the CPU: a check")
    parser.add_argument("--no-compile", action="store_true", help="eager rows only")
    parser.add_argument("--skip", default="", help="section numbers to leave out, e.g. 2,3,6")
    parser.add_argument("--fused-ops", default="",
                        help="ltm.train.fused_ops kernels swapped into both models (train.opt.fused_ops), "
                             "e.g. rms_norm,swiglu,rope")
    args = parser.parse_args()
    began = time.perf_counter()

    sizes = TINY_SIZES if args.tiny else SIZES
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    if device.type == "cpu" and not args.tiny:
        raise SystemExit("no CUDA device: run with --tiny for the CPU check")
    amp = device.type == "cuda"  # bf16 autocast on the GPU, float32 on the CPU
    compile = not args.no_compile
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    model_section = read_params(ROOT / "configs" / "gpu.yaml")["model"]
    if args.tiny:
        model_section = {**model_section, **TINY_MODEL}
    cfg = from_mapping(ModelConfig, model_section, "model")
    cfg = dataclasses.replace(cfg, max_seq_len=max(cfg.max_seq_len, sizes["seq_len"]))
    latent_cfg = dataclasses.replace(cfg, n_latent=sizes["n_latent"])
    latent = LatentConfig(steps=sizes["inner_steps"])  # the authors' recipe, eager inner loop
    batch, seq_len = sizes["batch"], sizes["seq_len"]
    tokens = batch * seq_len
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(cfg.vocab_size, (batch, seq_len), generator=generator).to(device)
    y = torch.randint(cfg.vocab_size, (batch, seq_len), generator=generator).to(device)

    record = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "triton": _version("triton"), "tiny": args.tiny,
              "model": dataclasses.asdict(cfg), "sizes": sizes, "amp": "bf16" if amp else "off",
              "latent": dataclasses.asdict(latent), "budget_s": args.budget,
              "repeats": args.repeats, "rows": [], "skipped": []}
    rows = record["rows"]

    def write():
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1, default=str) + "\n")

    def add(case: str, impl: str, fn, trains_tokens: bool) -> None:
        try:
            ms, first = timed(fn, device, args.repeats)
            error = None
        except Exception as err:  # noqa: BLE001 - a row that says why
            ms, first, error = math.nan, math.nan, f"{type(err).__name__}: {err}"[:400]
        rows.append({"case": case, "impl": impl, "ms": ms,
                     "tokens_per_s": tokens / (ms / 1e3) if trains_tokens else None,
                     "x_plain": None, "first_call_s": first, "error": error})
        print(f"  {case} {impl}: {ms:.2f} ms (first call {first:.1f} s)"
              + (f"  ERROR {error}" if error else ""), flush=True)

    def section(name: str) -> bool:
        spent = time.perf_counter() - began
        if name.split(".")[0] in args.skip.split(","):
            record["skipped"].append(f"{name} (--skip)")
            return False
        if spent > args.budget:
            record["skipped"].append(f"{name} (budget spent: {spent:.0f} s)")
            print(f"skipped: {name} ({spent:.0f} s > --budget {args.budget:.0f})", flush=True)
            write()
            return False
        print(f"{name} [{spent:.0f} s]", flush=True)
        return True

    torch.manual_seed(0)
    plain = LTM(dataclasses.replace(cfg, n_latent=0)).to(device)
    fused_ops = [op for op in args.fused_ops.split(",") if op]
    record["fused_ops"] = fused_ops
    if fused_ops:
        from ltm.train.fused_ops import apply_fused_ops
        apply_fused_ops(plain, fused_ops)
    plain_loss = LossModel(plain, False, False)
    if section("1. plain training step"):
        add("plain step", "eager", train_step(plain_loss, plain, x, y, device, amp), True)
        if compile:
            add("plain step", "compiled",
                train_step(torch.compile(plain_loss), plain, x, y, device, amp), True)
        write()
    del plain, plain_loss
    torch.manual_seed(0)
    model = LTM(latent_cfg).to(device)
    if fused_ops:
        apply_fused_ops(model, fused_ops)
    # the decoder's step compiled as training compiles it (train.opt.compile), the inner loop
    # swapped between the eager and the compiled fitter (posterior_sample is left out of the
    # compiled graph and calls loss_model.fitter)
    loss_model = LossModel(model, False, compile, latent)
    step_model = torch.compile(loss_model) if compile else loss_model
    eager_fitter = loss_model.fitter
    decoder = "decoder compiled" if compile else "decoder eager"
    if section("2. one inner step, eager"):
        add("inner step", "eager", inner_step(eager_fitter, latent_cfg, latent, x, y, device, amp),
            False)
        write()
    if section(f"3. latent training step, inner loop eager, {decoder}"):
        add(f"latent step ({latent.steps} inner)", f"inner eager, {decoder}",
            train_step(step_model, model, x, y, device, amp), True)
        write()
    if compile:
        compiled_fitter = decoder_fitter(model, dataclasses.replace(latent, compile=True), True)
        if section("4. one inner step, compiled"):
            add("inner step", "compiled",
                inner_step(compiled_fitter, latent_cfg, latent, x, y, device, amp), False)
            write()
        if section(f"5. latent training step, inner step compiled, {decoder}"):
            loss_model.fitter = compiled_fitter
            add(f"latent step ({latent.steps} inner)", f"inner compiled, {decoder}",
                train_step(step_model, model, x, y, device, amp), True)
            loss_model.fitter = eager_fitter
            write()
        if section("6. where one compiled inner step spends its time (torch.profiler)"):
            record["profile_inner"] = top_kernels(
                inner_step(compiled_fitter, latent_cfg, latent, x, y, device, amp), device)
            write()
        if device.type == "cuda":
            # CUDA graphs (cudagraph trees) over the compiled NLL's forward and backward
            graphed = PosteriorFitter(
                torch.compile(functools.partial(sequence_nll, model), mode="reduce-overhead"),
                latent, decoder=model.parameters())
            if section("7. one inner step, compiled with CUDA graphs"):
                add("inner step", "compiled + CUDA graphs",
                    inner_step(graphed, latent_cfg, latent, x, y, device, amp), False)
                write()
            if section(f"8. latent training step, inner step with CUDA graphs, {decoder}"):
                loss_model.fitter = graphed
                add(f"latent step ({latent.steps} inner)", f"inner CUDA graphs, {decoder}",
                    train_step(step_model, model, x, y, device, amp), True)
                loss_model.fitter = eager_fitter
                write()

    reference = next((r["ms"] for r in rows if r["case"] == "plain step"
                      and r["impl"] == ("compiled" if compile else "eager")), math.nan)
    for row in rows:
        row["x_plain"] = row["ms"] / reference if reference == reference else None
    record["reference"] = f"plain step {'compiled' if compile else 'eager'}: {reference:.2f} ms"
    record["seconds"] = round(time.perf_counter() - began, 1)
    write()
    print(f"\n{record['device']}, torch {record['torch']}, B={batch} T={seq_len}, "
          f"n_latent {sizes['n_latent']}, {latent.steps} inner steps; x_plain against the "
          f"{record['reference']}")
    print(f"{'case':<24} {'impl':<32} {'ms':>9} {'tokens/s':>10} {'x_plain':>8} {'1st s':>6}")
    for r in rows:
        tps = f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] else ""
        xp = f"{r['x_plain']:.2f}" if r["x_plain"] is not None else ""
        print(f"{r['case']:<24} {r['impl']:<32} {r['ms']:>9.2f} {tps:>10} {xp:>8} "
              f"{r['first_call_s']:>6.1f}" + (f"  {r['error']}" if r["error"] else ""))
    for item in record["skipped"]:
        print(f"skipped: {item}")
    print(f"written: {args.out} ({record['seconds']} s)")


def _version(name: str) -> str | None:
    try:
        return __import__(name).__version__
    except ImportError:
        return None


if __name__ == "__main__":
    main()
