"""Latent thoughts' training cost on one GPU (issue 15): the inner loop eager against a compiled
inner step, against a compiled plain training step.

    python -m ltm.bench.latent_run OUT.json [--budget SECONDS] [--repeats N]
    python -m ltm.bench.latent_run OUT.json --tiny     # the same sections, tiny, on the CPU
    python -m ltm.bench.latent_run OUT.json --init encoder --inner-steps 2   # semi-amortised

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

Beside `ltm.bench.latent` (the benchmark stage's smaller table) rather than in it: this one times
the GPU profile's model section by section under a budget, writing its record after each.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import time
from pathlib import Path
from typing import Callable

import torch

from ltm.bench.provenance import ROOT, version_of
from ltm.bench.timing import device_sync, first_call_s, host_ms
from ltm.device import device_name
from ltm.latent.encoder import attach_encoder
from ltm.latent.posterior import (LatentConfig, PosteriorFitter, decoder_fitter, latent_shape,
                                  sequence_nll, step_sizes)
from ltm.model.lm import LTM, ModelConfig
from ltm.params import from_mapping, read_params
from ltm.train.objective import LossModel

SIZES = dict(batch=16, seq_len=1024, n_latent=8, inner_steps=16)
TINY_SIZES = dict(batch=2, seq_len=32, n_latent=2, inner_steps=2)
TINY_MODEL = dict(vocab_size=256, n_layers=2, d_model=64, n_heads=2, max_seq_len=64,
                  kernel="torch", d_ff=None)
COLUMNS = ("case", "impl", "ms", "tokens_per_s", "x_plain", "first_call_s", "error")


def timed(fn: Callable, device: torch.device, repeats: int) -> tuple[float, float]:
    """(median ms of fn() over repeats, seconds of the first, untimed call: compilation)."""
    sync = device_sync(device)
    first = first_call_s(fn, sync=sync)
    return host_ms(fn, repeats, warmup=0, sync=sync), first


def train_step(step_model: Callable, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
               device: torch.device, amp: bool) -> Callable[[], None]:
    """One training step of step_model (forward, backward, fused AdamW on the GPU) as a call."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = step_model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def inner_step(fitter: PosteriorFitter, cfg: ModelConfig, latent: LatentConfig, x: torch.Tensor,
               y: torch.Tensor, device: torch.device, amp: bool) -> Callable[[], None]:
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


def top_kernels(fn: Callable, device: torch.device, steps: int = 3, top: int = 15) -> list[dict]:
    """The `top` operations of `steps` calls of fn by self device time (CPU time on the CPU):
    name, ms per call, share of the total."""
    from torch.profiler import ProfilerActivity, profile
    sync = device_sync(device)
    fn()
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            fn()
        sync()
    attr = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, attr, 0) > 0]
    total = sum(getattr(e, attr) for e in events) or 1.0
    events.sort(key=lambda e: -getattr(e, attr))
    rows = [{"name": e.key[:90], "ms_per_call": getattr(e, attr) / 1e3 / steps,
             "share": getattr(e, attr) / total} for e in events[:top]]
    for r in rows:
        print(f"    {r['ms_per_call']:8.3f} ms {100 * r['share']:5.1f}%  {r['name']}", flush=True)
    return rows


@dataclasses.dataclass
class LatentRun:
    """One run's settings (the command's arguments), inputs and record, rewritten to `out` after
    each section. Set up by `setup`; `run` measures every section."""
    out: Path
    budget: float
    repeats: int
    skip: str
    compile: bool
    device: torch.device
    amp: bool
    cfg: ModelConfig
    latent_cfg: ModelConfig
    latent: LatentConfig
    sizes: dict
    x: torch.Tensor
    y: torch.Tensor
    record: dict
    fused_ops: list
    began: float = dataclasses.field(default_factory=time.perf_counter)

    @property
    def rows(self) -> list[dict]:
        return self.record["rows"]

    def write(self) -> None:
        """The record as it stands, to `out`."""
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(json.dumps(self.record, indent=1, default=str) + "\n")

    def add(self, case: str, impl: str, fn: Callable, trains_tokens: bool) -> None:
        """A timed row (tokens/s where the step trains tokens), or one that says why it failed."""
        try:
            ms, first = timed(fn, self.device, self.repeats)
            error = None
        except Exception as err:  # noqa: BLE001 - a row that says why
            ms, first, error = math.nan, math.nan, f"{type(err).__name__}: {err}"[:400]
        tokens = self.sizes["batch"] * self.sizes["seq_len"]
        self.rows.append({"case": case, "impl": impl, "ms": ms,
                          "tokens_per_s": tokens / (ms / 1e3) if trains_tokens else None,
                          "x_plain": None, "first_call_s": first, "error": error})
        print(f"  {case} {impl}: {ms:.2f} ms (first call {first:.1f} s)"
              + (f"  ERROR {error}" if error else ""), flush=True)

    def section(self, name: str) -> bool:
        """Whether the section runs: not with --skip, nor once the budget is spent (then listed
        as skipped)."""
        spent = time.perf_counter() - self.began
        if name.split(".")[0] in self.skip.split(","):
            self.record["skipped"].append(f"{name} (--skip)")
            return False
        if spent > self.budget:
            self.record["skipped"].append(f"{name} (budget spent: {spent:.0f} s)")
            print(f"skipped: {name} ({spent:.0f} s > --budget {self.budget:.0f})", flush=True)
            self.write()
            return False
        print(f"{name} [{spent:.0f} s]", flush=True)
        return True


def setup(out: Path, budget: float, repeats: int, tiny: bool, compile: bool, skip: str,
          fused_ops: list[str], model_params: Path, began: float, inner_steps: int | None = None,
          init: str = "authors") -> LatentRun:
    """The run: the model section of `model_params` (tiny sizes on the CPU with `tiny`), the
    latent model's config, random tokens, and the record's header; `fused_ops`: the
    ltm.train.fused_ops kernels swapped into both models; inner_steps (None: the sizes') and
    init (train.latent.init: encoder adds the encoder's start and its own NELBO to the step)."""
    sizes = dict(TINY_SIZES if tiny else SIZES)
    if inner_steps is not None:
        sizes["inner_steps"] = inner_steps
    device = torch.device("cpu" if tiny or not torch.cuda.is_available() else "cuda")
    if device.type == "cpu" and not tiny:
        raise SystemExit("no CUDA device: run with --tiny for the CPU check")
    amp = device.type == "cuda"  # bf16 autocast on the GPU, float32 on the CPU
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    model_section = read_params(model_params)["model"]
    if tiny:
        model_section = {**model_section, **TINY_MODEL}
    cfg = from_mapping(ModelConfig, model_section, "model")
    cfg = dataclasses.replace(cfg, max_seq_len=max(cfg.max_seq_len, sizes["seq_len"]))
    # the authors' recipe (or another start of q), eager inner loop
    latent = LatentConfig(steps=sizes["inner_steps"], init=init)
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(cfg.vocab_size, (sizes["batch"], sizes["seq_len"]), generator=generator).to(device)
    y = torch.randint(cfg.vocab_size, (sizes["batch"], sizes["seq_len"]), generator=generator).to(device)
    record = {"device": device_name(device),
              "torch": torch.__version__, "triton": version_of("triton"), "tiny": tiny,
              "model": dataclasses.asdict(cfg), "sizes": sizes, "amp": "bf16" if amp else "off",
              "latent": dataclasses.asdict(latent), "budget_s": budget,
              "repeats": repeats, "rows": [], "skipped": [], "fused_ops": fused_ops}
    return LatentRun(out, budget, repeats, skip, compile, device, amp, cfg,
                     dataclasses.replace(cfg, n_latent=sizes["n_latent"]), latent, sizes, x, y,
                     record, fused_ops, began)


def fused(model: LTM, fused_ops: list[str]) -> LTM:
    """model with ltm.train.fused_ops's kernels swapped in (train.opt.fused_ops), if any asked:
    imported here, as Triton kernels are (see tests/test_imports.py)."""
    if fused_ops:
        from ltm.train.fused_ops import apply_fused_ops  # imports Triton: only when asked
        apply_fused_ops(model, fused_ops)
    return model


def plain_sections(run: LatentRun) -> None:
    """Section 1: the plain training step, eager and compiled."""
    torch.manual_seed(0)
    plain = fused(LTM(dataclasses.replace(run.cfg, n_latent=0)).to(run.device), run.fused_ops)
    plain_loss = LossModel(plain, False, False)
    if run.section("1. plain training step"):
        run.add("plain step", "eager",
                train_step(plain_loss, plain, run.x, run.y, run.device, run.amp), True)
        if run.compile:
            run.add("plain step", "compiled", train_step(torch.compile(plain_loss), plain, run.x,
                                                         run.y, run.device, run.amp), True)
        run.write()


def latent_sections(run: LatentRun) -> None:
    """Sections 2-8: the inner step and the whole latent step, eager, compiled and with CUDA
    graphs. The decoder's step is compiled as training compiles it (train.opt.compile), the
    inner loop swapped between fitters (posterior_sample is left out of the compiled graph and
    calls loss_model.fitter)."""
    torch.manual_seed(0)
    model = attach_encoder(fused(LTM(run.latent_cfg).to(run.device), run.fused_ops), run.latent)
    loss_model = LossModel(model, False, run.compile, run.latent)
    step_model = torch.compile(loss_model) if run.compile else loss_model
    eager_fitter = loss_model.fitter
    decoder = "decoder compiled" if run.compile else "decoder eager"
    inner = lambda fitter: inner_step(fitter, run.latent_cfg, run.latent, run.x, run.y,
                                      run.device, run.amp)
    whole = (f"latent step (encoder + {run.latent.steps} inner)" if run.latent.init == "encoder"
             else f"latent step ({run.latent.steps} inner)")

    def latent_row(impl: str, fitter: PosteriorFitter) -> None:
        loss_model.fitter = fitter
        run.add(whole, impl, train_step(step_model, model, run.x, run.y, run.device, run.amp), True)
        loss_model.fitter = eager_fitter

    if run.section("2. one inner step, eager"):
        run.add("inner step", "eager", inner(eager_fitter), False)
        run.write()
    if run.section(f"3. latent training step, inner loop eager, {decoder}"):
        run.add(whole, f"inner eager, {decoder}",
                train_step(step_model, model, run.x, run.y, run.device, run.amp), True)
        run.write()
    if not run.compile:
        return
    compiled_fitter = decoder_fitter(model, dataclasses.replace(run.latent, compile=True), True)
    if run.section("4. one inner step, compiled"):
        run.add("inner step", "compiled", inner(compiled_fitter), False)
        run.write()
    if run.section(f"5. latent training step, inner step compiled, {decoder}"):
        latent_row(f"inner compiled, {decoder}", compiled_fitter)
        run.write()
    if run.section("6. where one compiled inner step spends its time (torch.profiler)"):
        run.record["profile_inner"] = top_kernels(inner(compiled_fitter), run.device)
        run.write()
    if run.device.type == "cuda":
        # CUDA graphs (cudagraph trees) over the compiled NLL's forward and backward
        graphed = PosteriorFitter(
            torch.compile(functools.partial(sequence_nll, model), mode="reduce-overhead"),
            run.latent, decoder=model.parameters())
        if run.section("7. one inner step, compiled with CUDA graphs"):
            run.add("inner step", "compiled + CUDA graphs", inner(graphed), False)
            run.write()
        if run.section(f"8. latent training step, inner step with CUDA graphs, {decoder}"):
            latent_row(f"inner CUDA graphs, {decoder}", graphed)
            run.write()


def finish(run: LatentRun) -> None:
    """x_plain against the plain step (compiled, or eager without compile), the run's seconds,
    the record written and the table printed."""
    reference = next((r["ms"] for r in run.rows if r["case"] == "plain step"
                      and r["impl"] == ("compiled" if run.compile else "eager")), math.nan)
    for row in run.rows:
        row["x_plain"] = row["ms"] / reference if reference == reference else None
    record = run.record
    record["reference"] = f"plain step {'compiled' if run.compile else 'eager'}: {reference:.2f} ms"
    record["seconds"] = round(time.perf_counter() - run.began, 1)
    run.write()
    print(f"\n{record['device']}, torch {record['torch']}, B={run.sizes['batch']} "
          f"T={run.sizes['seq_len']}, n_latent {run.sizes['n_latent']}, {run.latent.steps} inner "
          f"steps; x_plain against the {record['reference']}")
    print(f"{'case':<24} {'impl':<32} {'ms':>9} {'tokens/s':>10} {'x_plain':>8} {'1st s':>6}")
    for r in run.rows:
        tps = f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] else ""
        xp = f"{r['x_plain']:.2f}" if r["x_plain"] is not None else ""
        print(f"{r['case']:<24} {r['impl']:<32} {r['ms']:>9.2f} {tps:>10} {xp:>8} "
              f"{r['first_call_s']:>6.1f}" + (f"  {r['error']}" if r["error"] else ""))
    for item in record["skipped"]:
        print(f"skipped: {item}")
    print(f"written: {run.out} ({record['seconds']} s)")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--budget", type=float, default=330.0,
                        help="seconds after which no further section starts")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="tiny sizes on the CPU: a check")
    parser.add_argument("--no-compile", action="store_true", help="eager rows only")
    parser.add_argument("--skip", default="", help="section numbers to leave out, e.g. 2,3,6")
    parser.add_argument("--inner-steps", type=int, default=None,
                        help="inner steps of the latent step (default: the authors' 16)")
    parser.add_argument("--init", choices=("authors", "prior", "encoder"), default="authors",
                        help="q's start (train.latent.init); encoder: semi-amortised, its own "
                             "NELBO in the step")
    parser.add_argument("--fused-ops", default="",
                        help="ltm.train.fused_ops kernels swapped into both models (train.opt.fused_ops), "
                             "e.g. rms_norm,swiglu,rope")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    began = time.perf_counter()
    run = setup(args.out, args.budget, args.repeats, args.tiny, not args.no_compile, args.skip,
                [op for op in args.fused_ops.split(",") if op], ROOT / "configs" / "gpu.yaml", began,
                args.inner_steps, args.init)
    plain_sections(run)
    latent_sections(run)
    finish(run)


if __name__ == "__main__":
    main()
