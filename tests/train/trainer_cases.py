"""Shared by the trainer's tests (tests/train/test_trainer*.py, test_counterpart.py): a small
token cache, tiny configurations, the train stage's command line, one thread per process."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from ltm.data.cache import DataConfig, build_cache
from ltm.model.lm import ModelConfig
from ltm.train.settings import OptConfig, TrainConfig

# the subprocesses' working directory: tests/, not the repository root, so that they import the
# installed package (which maps ltm.kernels to kernels/) rather than the checkout's ltm/
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    # on a shared two-core machine, two spinning OpenMP threads per process make tiny steps 10x
    # slower; one thread is also what the subprocesses below get
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield
    torch.set_num_threads(threads)


def write_corpus(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng()
    words = ["king", "queen", "crown", "sword", "night", "love", "death", "the", "of", "and"]
    for i in range(8):
        (root / f"doc{i}.txt").write_text(f"Document {i}.\n" + " ".join(rng.choice(words, 600)) + "\n")
    return root


def make_cache(corpus: Path, cache: Path, val_fraction: float = 0.25) -> str:
    build_cache(DataConfig(source=str(corpus), vocab_size=300, val_fraction=val_fraction,
                           shard_tokens=4096, cache_dir=str(cache)), progress=False)
    return str(cache)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    corpus = write_corpus(tmp_path_factory.mktemp("train_corpus"))
    return make_cache(corpus, tmp_path_factory.mktemp("train_cache"))


def tiny(mixer: str = "attention", **train) -> tuple[ModelConfig, TrainConfig]:
    opt = train.pop("opt", {})
    settings = dict(steps=3, batch_size=4, seq_len=16, warmup_steps=1, eval_every=100,
                    eval_batches=2, log_every=1, timing_warmup=1, resume=False,
                    seed=int(torch.randint(0, 2**31, (1,))), opt=OptConfig(**opt))
    settings.update(train)
    return (ModelConfig(mixer=mixer, n_layers=2, d_model=32, n_heads=2, max_seq_len=32),
            TrainConfig(**settings))


def train_losses(result) -> list[float]:
    return [r["loss"] for r in result.history if r["split"] == "train"]


def rel_diff(a: list[float], b: list[float]) -> float:
    a, b = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    return float((a - b).norm() / b.norm())


def write_params(path: Path, cache_dir: str, model: dict, train: dict) -> Path:
    path.write_text(yaml.safe_dump({"data": {"cache_dir": cache_dir}, "model": model, "train": train}))
    return path


def cli(params: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ltm.stages.train", "--params", str(params), "--out-dir", str(out / "ckpt"),
            "--metrics", str(out / "train.json"), "--plot", str(out / "loss.csv"), "--no-progress",
            *extra]




def run_to_completion(command: list[str]) -> None:
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def curve(path: Path) -> list[tuple[int, float]]:
    """(step, loss) rows of a loss-curve CSV (step,seconds,loss[,train_seconds,tokens]):
    wall-clock seconds differ between runs, the losses must not."""
    header, *lines = path.read_text().split()
    names = header.split(",")
    rows = [dict(zip(names, line.split(","))) for line in lines]
    return [(int(row["step"]), float(row["loss"])) for row in rows]


# a latent model too: its inner loop draws q's start and noise from the global generator, whose
# state the checkpoint must carry for the resumed run to fit the same posteriors
LATENT_RUN = dict(latent={"steps": 2, "eval_steps": [0, 2], "eval_batches": 1},
                  counterpart={"enabled": False})


