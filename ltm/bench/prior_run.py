"""The learned prior over latent thoughts on one GPU (issue 20): train a latent model and a plain
model briefly, fit posteriors, train the prior, then the benchmark stage's table (ltm.bench.prior):
1000-step DDPM against DPM-Solver++ at 5, 10, 20, 50 evaluations, z ~ N(0, I) at 0.5 and 1.0,
the plain LM's own samples.

    python -m ltm.bench.prior_run OUT.json [--cache-dir data/cache] [--train-steps 150]
    python -m ltm.bench.prior_run OUT.json --tiny      # the same, tiny, on the CPU (about a minute)

GPU sizes: the GPU profile's width (configs/gpu.yaml: attention, 12 layers, d_model 768, 12
heads) at T=256, batch 16, with n_latent 8 thoughts per layer and 4 inner steps (reduced from the
authors' 16 for the minutes; z is 96 slots x 768 = 73,728 numbers), trained --train-steps steps;
the prior a 4-block DiT of width 256 over patches of 64 numbers (1152 tokens per z), 1500 steps
of 64; the models train eagerly (no compile time) with bf16 autocast. Data: the token cache in --cache-dir when given (carry data/cache: vocabulary 2048),
else random tokens, which measure time only (the distances and perplexities of a model trained
on noise mean little; OUT.json's `data` says which). float32 with TF32 matmuls, eager.

Every timed sampler runs once untimed first (ltm.bench.prior warms both schedulers, and builds
and captures the decoder's CUDA graph before its clock starts). OUT.json holds the rows, the
summary, the prior's training metrics, the device, versions and commit.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from ltm.bench.prior import PriorBench, bench_prior
from ltm.bench.provenance import commit
from ltm.device import device_name
from ltm.data.batches import SyntheticTokens
from ltm.latent.posterior import LatentConfig
from ltm.latent.prior import MODELS_FILE, POSTERIOR_FILE, PRIOR_DIR, PriorConfig
from ltm.model.lm import ModelConfig
from ltm.params import from_mapping
from ltm.train.checkpoint import load_model
from ltm.train.counterpart import LATENT, SUBFOLDERS
from ltm.train.prior_trainer import fit_posteriors, posterior_set, train_prior
from ltm.train.settings import TrainConfig
from ltm.train.trainer import run_training

SIZES = {  # (model, train, prior, bench) overrides
    "gpu": (dict(vocab_size=50304, n_layers=12, d_model=768, n_heads=12, d_ff=2048,
                 max_seq_len=1024, kernel="torch"),
            dict(seq_len=256, batch_size=16, lr=6e-4, min_lr=6e-5, warmup_steps=10),
            dict(patch=64, width=256, depth=4, n_heads=8, steps=1500, batch_size=64, lr=5e-4,
                 ema=0.999, train_sequences=1024, heldout_sequences=320, fit_batch=64),
            dict(samples=64, new_tokens=64)),
    "tiny": (dict(vocab_size=512, n_layers=2, d_model=32, n_heads=2, max_seq_len=64),
             dict(seq_len=32, batch_size=8, lr=3e-3, min_lr=3e-4, warmup_steps=2),
             dict(patch=16, width=32, depth=1, n_heads=2, steps=60, batch_size=32,
                  train_sequences=64, heldout_sequences=48, fit_batch=16),
             dict(samples=16, new_tokens=16, baseline_steps=1000, pca_dims=4)),
}


def train_models(root: Path, size: str, steps: int, n_latent: int, inner: int,
                 cache_dir: str | None, device: str) -> tuple[Path, Path]:
    """A plain model in root and a latent one in its counterpart folder, as the train stage."""
    model_kw, train_kw, _, _ = SIZES[size]
    model = ModelConfig(**model_kw)
    train = from_mapping(TrainConfig, dict(
        train_kw, device=device, steps=steps, data="cache" if cache_dir else "synthetic",
        eval_every=steps, eval_batches=2, checkpoint_every=0, resume=False, log_every=50,
        timing_warmup=2, counterpart={"enabled": False}, opt={"compile": False},
        latent={"steps": inner, "eval_steps": [inner], "eval_batches": 1}), "train")
    if cache_dir:  # the cache's vocabulary
        model = dataclasses.replace(model, vocab_size=0)
    latent_dir = root / SUBFOLDERS[LATENT]
    for folder, n in ((root, 0), (latent_dir, n_latent)):
        start = time.perf_counter()
        run_training(dataclasses.replace(model, n_latent=n), train, cache_dir or "", str(folder),
                     progress=False)
        print(f"trained {'latent' if n else 'plain'} model: {steps} steps in "
              f"{time.perf_counter() - start:.1f} s", flush=True)
    return latent_dir, root


def synthetic_posteriors(latent_dir: Path, cfg: PriorConfig, device: torch.device) -> dict:
    """posterior_set's dict from random-token windows (no token cache); bos = token 0."""
    saved = torch.load(latent_dir / "last.pt", map_location="cpu", weights_only=False)
    latent_cfg = from_mapping(LatentConfig, saved["train_cfg"]["latent"], "train.latent")
    model = load_model(latent_dir, device)
    data = SyntheticTokens(model.cfg.vocab_size, cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed)
    out = {"bos": 0, "latent_steps": latent_cfg.steps, "source": "synthetic"}
    start = time.perf_counter()
    for split, n in (("train", cfg.train_sequences), ("heldout", cfg.heldout_sequences)):
        windows = [data.sample_batch(min(cfg.fit_batch, n - i), saved["train_cfg"]["seq_len"],
                                     generator) for i in range(0, n, cfg.fit_batch)]
        out[f"{split}_mu"], out[f"{split}_log_var"] = fit_posteriors(
            model, latent_cfg, windows, torch.Generator(device).manual_seed(cfg.seed))
        out[f"{split}_tokens"] = torch.cat([x for x, _ in windows])
    out["seconds"] = time.perf_counter() - start
    return out


def table_text(rows: list[dict]) -> str:
    """The benchmark's rows as a text table."""
    cols = ["source", "sampler", "evaluations", "ms_per_z", "ms_per_sequence", "mmd2",
            "mmd2_noise", "fd_pca", "gen_ppl", "token_entropy"]
    lines = ["  ".join(f"{c:>14}" for c in cols)]
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c)
            cells.append(f"{v:>14.4g}" if isinstance(v, float) else f"{str(v):>14}")
        lines.append("  ".join(cells))
    return "\n".join(lines)


def fit_prior(root: Path, latent_dir: Path, size: str, cache_dir: str | None,
              device: torch.device) -> dict:
    """Posteriors of the latent model (on the token cache, else on random tokens), then the prior
    trained on them, in root's prior folder with the models file the benchmark reads; returns
    the prior's training metrics."""
    cfg = PriorConfig(**SIZES[size][2])
    folder = root / PRIOR_DIR
    if cache_dir:
        posteriors = posterior_set(latent_dir, cache_dir, cfg, device, folder / POSTERIOR_FILE)
    else:
        posteriors = synthetic_posteriors(latent_dir, cfg, device)
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(posteriors, folder / POSTERIOR_FILE)
    print(f"posteriors: {posteriors['seconds']:.1f} s", flush=True)
    _, trained = train_prior(cfg, posteriors, folder, device)
    print(f"prior: {trained['steps']} steps, loss {trained['train_loss_first']:.4f} -> "
          f"{trained['train_loss_last']:.4f} in {trained['seconds_this_run']:.1f} s", flush=True)
    (folder / MODELS_FILE).write_text(json.dumps({"latent": SUBFOLDERS[LATENT], "plain": "."}))
    return trained


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="JSON written at the end")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes on the CPU")
    parser.add_argument("--cache-dir", default=None, help="token cache (default: random tokens)")
    parser.add_argument("--train-steps", type=int, default=None,
                        help="steps of each model (default 150 on a GPU, 20 tiny)")
    parser.add_argument("--work-dir", default=None, help="checkpoints (default: next to OUT)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    size = "tiny" if args.tiny else "gpu"
    device = torch.device("cpu" if args.tiny else "cuda")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("error: no CUDA device (run with --tiny on the CPU)")
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    steps = args.train_steps or (20 if args.tiny else 150)
    root = Path(args.work_dir or Path(args.out).with_suffix("")) / "checkpoints"
    start = time.perf_counter()
    latent_dir, _ = train_models(root, size, steps, 2 if args.tiny else 8, 1 if args.tiny else 4,
                                 args.cache_dir, device.type)
    trained = fit_prior(root, latent_dir, size, args.cache_dir, device)
    rows, summary = bench_prior(PriorBench(**SIZES[size][3]), root, device)
    record = {"device": device_name(device),
              "torch": torch.__version__, "commit": commit(),
              "data": "cache " + args.cache_dir if args.cache_dir else "random tokens",
              "train_steps": steps, "prior_train": trained, "summary": summary, "rows": rows,
              "seconds": round(time.perf_counter() - start, 1)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(table_text(rows))
    print(json.dumps({k: v for k, v in summary.items() if k != "by_source"}, indent=1))
    print(f"{record['device']}: {record['seconds']} s in all; wrote {args.out}")


if __name__ == "__main__":
    main()
