"""The study's models and how each is trained: the latent decoder with its encoder (semi-amortised
inference), a plain decoder with as many non-embedding parameters, and the same latent decoder
with one learned z shared by every sequence. Every model trains on the same batches in the same
order (equal tokens) with the same optimiser and schedule; the plain model again at the latent
model's training FLOPs."""
from __future__ import annotations

import dataclasses
import math
import time

import torch
from torch import nn
from tqdm.auto import tqdm

from ltm.latent.encoder import attach_encoder
from ltm.model.config import ModelConfig
from ltm.model.lm import LTM
from ltm.study.scoring import Scored, bound_curves, latent_config, raw_bounds, score_contender
from ltm.study.settings import StudyConfig
from ltm.study.sources import StudySource
from ltm.train.counterpart import flops_of, inner_passes
from ltm.train.objective import LossModel
from ltm.train.optimizers import make_optimizer
from ltm.train.settings import TrainConfig
from ltm.workers import cpu_workers, run_jobs


def decoder_config(cfg: StudyConfig, vocab_size: int, seq_len: int, n_latent: int,
                   d_ff: int | None = None) -> ModelConfig:
    """A study decoder: softmax attention through cfg.window tokens, n_latent latents per layer."""
    return ModelConfig(vocab_size=vocab_size, mixer="attention", n_layers=cfg.n_layers,
                       d_model=cfg.d_model, n_heads=cfg.n_heads, d_ff=d_ff,
                       max_seq_len=seq_len, window=cfg.window, n_latent=n_latent)


def non_embedding_params(model: nn.Module) -> int:
    """Trained numbers outside the embedding (tied head): decoder, encoder, shared z alike."""
    embed = next(m for m in model.modules() if isinstance(m, LTM)).embed.weight
    return sum(p.numel() for p in model.parameters() if p is not embed)


def matched_d_ff(cfg: StudyConfig, vocab_size: int, seq_len: int, target: int) -> int:
    """The plain decoder's MLP width (a multiple of 8) whose non-embedding parameters come
    closest to `target`: each unit of d_ff costs 3 * d_model weights per layer."""
    with torch.device("meta"):
        base = LTM(decoder_config(cfg, vocab_size, seq_len, 0, d_ff=8)).num_params()
    per_unit = 3 * cfg.d_model * cfg.n_layers
    return max(8, 8 + 8 * round((target - base) / per_unit / 8))


class SharedLatents(nn.Module):
    """The latent decoder with one trained z for every sequence (no inference): what the extra
    cross-attention buys without per-sequence information."""

    def __init__(self, model: LTM) -> None:
        super().__init__()
        self.model = model
        c = model.cfg
        self.z = nn.Parameter(torch.randn(1, c.n_layers * c.n_latent, c.d_model))  # (1, L, D)

    def latents(self, batch: int) -> torch.Tensor:
        return self.z.expand(batch, -1, -1)  # (B, L, D)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.model(x, y, z=self.latents(len(x)))[1]


@dataclasses.dataclass
class Contenders:
    """The trained models of one source and training seed, and their scores (each contender
    scored in the job that trained it, ltm.study.scoring); equal_flops None when over the cap
    (why in `notes`)."""

    latent: LTM
    plain: LTM
    shared: SharedLatents
    equal_flops: LTM | None
    equal_flops_steps: int
    params: dict[str, int]
    train_loss: dict[str, float]
    notes: list[str]
    # suffix NLL per sequence (N,) under every name the contenders provide (latent, shuffled,
    # plain, dynamic, shared, plain_equal_flops)
    scores: dict = dataclasses.field(default_factory=dict)
    dynamic: dict | None = None  # dynamic evaluation's chosen step size
    curves: list[dict] | None = None  # the first seed's latent model only
    bounds: dict | None = None  # ... and its published-vs-honest bounds per sequence
    inner_lr: dict | None = None  # the step size chosen, and each candidate's pilot (first seed)


def _schedule(cfg: StudyConfig, steps: int) -> TrainConfig:
    return TrainConfig(steps=steps, lr=cfg.lr, min_lr=cfg.lr / 10, warmup_steps=cfg.warmup_steps,
                       weight_decay=cfg.weight_decay)


def train_model(module: nn.Module, source: StudySource, cfg: StudyConfig, steps: int,
                desc: str, progress: bool = True) -> float:
    """Train module (forward(x, y) -> mean loss, on the device of source.val_x) for `steps`
    batches of the source, drawn from cfg.seed's generator: every model sees the same batches.
    Returns the mean of the last 10% of the training losses."""
    optimizer, scheduler = make_optimizer(module, _schedule(cfg, steps), fused=False)
    generator = torch.Generator().manual_seed(cfg.seed)
    losses = []
    module.train()
    # disable None: a bar on a terminal only, never kept update by update in a stored notebook
    for _ in tqdm(range(steps), desc=desc, disable=None if progress else True, leave=False):
        x, y = (t.to(source.val_x.device) for t in source.sample(cfg.batch_size, generator))
        loss = module(x, y)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"study {desc}: the loss is {loss.item()}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    module.eval()
    tail = losses[-max(1, steps // 10):]
    return sum(tail) / len(tail)


def _built(model_cfg: ModelConfig, seed: int, device: torch.device) -> LTM:
    torch.manual_seed(seed)  # every model of a source starts from the same draw where shapes agree
    return LTM(model_cfg).to(device)


# the contenders, longest to train first (the worker pool starts them first)
CONTENDERS = ("latent", "plain_equal_flops", "plain", "shared")
LABELS = {"latent": "latent", "plain": "plain", "shared": "shared z",
          "plain_equal_flops": "plain, equal FLOPs"}


@dataclasses.dataclass
class Plan:
    """What one source's contenders are: the decoders' configurations, each one's steps, and
    which of them train (the plain model at equal FLOPs not when over
    study.max_equal_flops_steps)."""

    latent: ModelConfig
    plain: ModelConfig
    steps: dict[str, int]
    names: list[str]


def plan_contenders(source: StudySource, cfg: StudyConfig) -> Plan:
    """The latent decoder, the plain one with as many non-embedding parameters (through d_ff),
    and the plain model's steps at the latent model's training FLOPs."""
    T, V = source.val_x.shape[1], source.vocab_size
    latent_cfg = decoder_config(cfg, V, T, cfg.n_latent)
    with torch.device("meta"):
        target = non_embedding_params(attach_encoder(LTM(latent_cfg), latent_config(cfg)))
    plain_cfg = decoder_config(cfg, V, T, 0, d_ff=matched_d_ff(cfg, V, T, target))
    equal = math.ceil(cfg.steps * flops_of(latent_cfg, T, inner_passes(latent_config(cfg)))
                      / flops_of(plain_cfg, T, 0))
    steps = {"latent": cfg.steps, "plain": cfg.steps, "shared": cfg.steps, "plain_equal_flops": equal}
    names = [n for n in CONTENDERS if n != "plain_equal_flops" or equal <= cfg.max_equal_flops_steps]
    return Plan(latent_cfg, plain_cfg, steps, names)


def build_contender(name: str, plan: Plan, cfg: StudyConfig, device: torch.device) -> nn.Module:
    """One contender as it trains (forward(x, y) -> mean loss), its weights drawn from cfg.seed:
    built the same in every process."""
    if name == "latent":
        model = attach_encoder(_built(plan.latent, cfg.seed, device), latent_config(cfg))
        return LossModel(model, False, False, latent_config(cfg))
    if name == "shared":
        return SharedLatents(_built(plan.latent, cfg.seed, device)).to(device)
    return LossModel(_built(plan.plain, cfg.seed, device), False, False)


def train_contender(name: str, plan: Plan, source: StudySource, cfg: StudyConfig,
                    progress: bool = False, first_seed: bool = True
                    ) -> tuple[dict, float, float, Scored]:
    """Build, train and score one contender: (its weights on the CPU, training loss, seconds
    training and scoring, its scores). The global generator (the inner loop's noise) is seeded
    here: the result does not depend on what ran before in the process."""
    start = time.perf_counter()
    module = build_contender(name, plan, cfg, source.val_x.device)
    torch.manual_seed(cfg.seed)
    loss = train_model(module, source, cfg, plan.steps[name], f"study {source.name}: {LABELS[name]}",
                       progress)
    scored = score_contender(name, module, source, cfg, first_seed)
    weights = {k: v.cpu() for k, v in module.state_dict().items()}
    return weights, loss, time.perf_counter() - start, scored


def seed_configs(cfg: StudyConfig) -> list[StudyConfig]:
    """One configuration per training seed: cfg.seed, cfg.seed + 1, ... (cfg.seeds of them);
    each draws new initial weights and a new stream of training batches."""
    return [dataclasses.replace(cfg, seed=cfg.seed + i) for i in range(cfg.seeds)]


def latent_curves(weights: dict, plan: Plan, source: StudySource, cfg: StudyConfig
                  ) -> tuple[list[dict], dict]:
    """The bound curves and the published-vs-honest bounds of a trained latent contender (a job:
    the first seed's model, once its step size is chosen)."""
    module = build_contender("latent", plan, cfg, source.val_x.device)
    module.load_state_dict(weights)
    module.eval()
    return bound_curves(module.model, source, cfg), raw_bounds(module.model, source, cfg)


def _with_lr(cfg: StudyConfig, lr: float) -> StudyConfig:
    return dataclasses.replace(cfg, inner_lrs=[lr])


def train_contenders(source: StudySource, cfg: StudyConfig, progress: bool = True,
                     say=print) -> list[Contenders]:
    """`train_sources` for one source."""
    return train_sources([source], cfg, progress, say)[0]


def train_sources(sources: list[StudySource], cfg: StudyConfig, progress: bool = True,
                  say=print) -> list[list[Contenders]]:
    """For each source and training seed (seed_configs): the latent model, the
    parameter-matched plain model, the shared-latents model (all for cfg.steps batches) and the
    plain model at the latent model's training FLOPs, each trained and scored in one job, side by
    side on a CPU (study.workers processes). Two rounds, each with every source's jobs in one
    pool (a round of one source left a worker idle at its end): the first seed's latent model at
    every step size of cfg.inner_lrs (the pilots) beside the controls of every seed; then the
    chosen pilot's curves and the other seeds' latent models at its step size
    (`choose_inner_lr`). Returns each source's Contenders per seed."""
    plans = [plan_contenders(source, cfg) for source in sources]
    seeds = seed_configs(cfg)
    single = len(cfg.inner_lrs) == 1  # no choice: the pilot is the first seed's model, curves too
    # (source index, job), longest first: every source's pilots, then the controls
    pilots = [(i, ("latent", plan, source, _with_lr(seeds[0], lr), progress, single))
              for i, (plan, source) in enumerate(zip(plans, sources)) for lr in cfg.inner_lrs]
    controls = [(i, (name, plan, source, seeded, progress, False))
                for i, (plan, source) in enumerate(zip(plans, sources))
                for seeded in seeds for name in plan.names if name != "latent"]
    device = sources[0].val_x.device  # every source on the study's device (run.on_device)
    first = _pooled(pilots + controls, len(sources), device, cfg, say)
    chosen, second_jobs = [], []
    for i, (plan, source, results) in enumerate(zip(plans, sources, first)):
        best, inner_lr = choose_inner_lr(cfg.inner_lrs, results[:len(cfg.inner_lrs)])
        seeded = [_with_lr(s, inner_lr["chosen"]) for s in seeds]
        chosen.append((best, inner_lr, seeded))
        curves = [] if single else [(i, ("curves", results[best][0], plan, source, seeded[0]))]
        second_jobs += curves + [(i, ("latent", plan, source, s, progress, False))
                                 for s in seeded[1:]]
    second = _pooled(second_jobs, len(sources), device, cfg, say)
    return [_source_runs(plan, source, cfg, results, later, *picked, single, say)
            for plan, source, results, later, picked in zip(plans, sources, first, second, chosen)]


def _pooled(tagged: list[tuple[int, tuple]], n_sources: int, device: torch.device,
            cfg: StudyConfig, say) -> list[list]:
    """(source index, job) pairs run in one pool (`_run`); each source's results, in its jobs'
    order."""
    results = _run([job for _, job in tagged], device, cfg, say)
    return [[r for (i, _), r in zip(tagged, results) if i == source] for source in range(n_sources)]


def _source_runs(plan: Plan, source: StudySource, cfg: StudyConfig, first: list, second: list,
                 best: int, inner_lr: dict, chosen: list[StudyConfig], single: bool,
                 say) -> list[Contenders]:
    """One source's Contenders per seed from its jobs' results: `first` its pilots then its
    controls, `second` the chosen pilot's curves (unless `single`) then the other seeds' latent
    models."""
    if not single:
        first[best][3].curves, first[best][3].bounds = second.pop(0)
        say(f"study {source.name}: inner step size {inner_lr['chosen']} of {cfg.inner_lrs}")
    notes = [] if "plain_equal_flops" in plan.names else [
        f"plain at equal training FLOPs skipped: needs {plan.steps['plain_equal_flops']} steps, "
        f"over study.max_equal_flops_steps {cfg.max_equal_flops_steps}"]
    for note in notes:
        say(note)
    n_pilots = len(cfg.inner_lrs)
    others, latents = iter(first[n_pilots:]), iter([first[best]] + second)
    runs = []
    for seeded in chosen:
        results = [next(latents) if name == "latent" else next(others) for name in plan.names]
        runs.append(dataclasses.replace(_assembled(plan, seeded, source.val_x.device, results,
                                                   notes), inner_lr=inner_lr))
    return runs


def choose_inner_lr(lrs: list[float], pilots: list[tuple]) -> tuple[int, dict]:
    """The pilot (train_contender's result) that trained to the lowest loss, the mean of its
    last 10% of steps: a bound on the training sequences, so the scored sequences play no part
    in the choice. Returns its index and the record of the choice, each pilot's scored suffix
    NLL kept for the report."""
    losses = [result[1] for result in pilots]
    best = min(range(len(lrs)), key=losses.__getitem__)
    return best, {"chosen": lrs[best], "by": "the first seed's training loss (last 10% of its steps)",
            "pilots": [{"lr": lr, "train_loss": loss,
                        "suffix_nll": float(result[3].scores["latent"].mean())}
                       for lr, loss, result in zip(lrs, losses, pilots)]}


def _job(kind: str, *args):
    """A worker's job: "curves" (latent_curves) or a contender's name (train_contender)."""
    return latent_curves(*args) if kind == "curves" else train_contender(kind, *args)


def _run(jobs: list[tuple], device: torch.device, cfg: StudyConfig, say) -> list:
    """The jobs (_job's arguments; each names its plan and source) on study.workers processes (a
    GPU run stays in this process), saying each training job's steps, seconds and loss as it
    finishes."""
    workers = cpu_workers(cfg.workers, len(jobs), device)

    def report(index: int, result: tuple) -> None:
        name = jobs[index][0]
        if name == "curves":
            return
        _, plan, source, seeded = jobs[index][:4]
        lr = f", inner lr {seeded.inner_lrs[0]}" if name == "latent" else ""
        say(f"study {source.name}: {LABELS[name]} (seed {seeded.seed}{lr}): {plan.steps[name]} "
            f"steps and scoring in {result[2]:.0f} s, training loss {result[1]:.3f}")

    # a progress bar only where one job runs at a time
    jobs = [job if job[0] == "curves" else (*job[:4], job[4] and workers == 1, job[5])
            for job in jobs]
    return run_jobs(_job, jobs, workers, report)


def _assembled(plan: Plan, cfg: StudyConfig, device: torch.device, results: list[tuple],
               notes: list[str]) -> Contenders:
    """One seed's Contenders from its trained weights (in plan.names' order)."""
    trained, scores = {}, {}
    for name, (weights, _, _, scored) in zip(plan.names, results):
        scores.update(scored.scores)
        trained[name] = build_contender(name, plan, cfg, device)
        trained[name].load_state_dict(weights)
        trained[name].eval()
    unwrap = lambda name: trained[name].model if name in trained else None  # noqa: E731
    params = {"latent": non_embedding_params(trained["latent"]), "plain": unwrap("plain").num_params(),
              "shared": non_embedding_params(trained["shared"])}
    return Contenders(unwrap("latent"), unwrap("plain"), trained["shared"], unwrap("plain_equal_flops"),
                      plan.steps["plain_equal_flops"], params,
                      {n: r[1] for n, r in zip(plan.names, results)}, notes, scores,
                      results[plan.names.index("plain")][3].dynamic,
                      results[plan.names.index("latent")][3].curves,
                      results[plan.names.index("latent")][3].bounds)
