"""The latent prior's benchmark (ltm.bench.prior): the distance estimators against known answers,
the text metrics, and the whole path on tiny models: the train stage's prior step, the benchmark
rows and summary, the report's section."""
import dataclasses
import json
import math

import numpy as np
import pytest
import torch
import yaml

from ltm.train import checkpoint as ckpt
from ltm.bench.prior import (PriorBench, frechet, frechet_from_stats, generative_nll, mmd2,
                             token_entropy)
from ltm.data.cache import DataConfig, build_cache
from ltm.latent.posterior import LatentConfig
from ltm.model.lm import LTM, ModelConfig
from ltm.params import ParamsError, from_mapping, to_dict
from ltm.stages.prior import prior_benchmark, prior_stage
from ltm.report.page import prior_section


# one intra-op thread (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("one_thread")


def test_frechet_of_gaussians_has_its_closed_form():
    """Commuting covariances: |mu1 - mu2|^2 + sum (sqrt(l1) - sqrt(l2))^2 over eigenvalues."""
    q, _ = torch.linalg.qr(torch.randn(4, 4, dtype=torch.float64))
    l1 = torch.tensor([1.0, 2.0, 0.5, 3.0], dtype=torch.float64)
    l2 = torch.tensor([0.2, 2.0, 4.0, 1.0], dtype=torch.float64)
    cov1, cov2 = q @ torch.diag(l1) @ q.T, q @ torch.diag(l2) @ q.T
    mu1, mu2 = torch.zeros(4, dtype=torch.float64), torch.tensor([1.0, 0, -2, 0], dtype=torch.float64)
    expected = 5.0 + float((l1.sqrt() - l2.sqrt()).square().sum())
    assert float(frechet_from_stats(mu1, cov1, mu2, cov2)) == pytest.approx(expected, rel=1e-9)


def test_the_sample_frechet_distance_and_its_noise():
    """Large samples of two known Gaussians: the estimate within 4 of its standard errors of the
    true distance (its bias, about d^2 / n here, is far below that), and the jackknife error near
    the spread of repeated estimates (within a factor of 2)."""
    generator = torch.Generator().manual_seed(0)
    d, n = 3, 4000
    scale = torch.tensor([1.0, 0.5, 2.0])
    true = 1.0 + float((scale - 1).square().sum())  # mean shift 1 in the first coordinate
    estimates, errors = [], []
    for _ in range(8):
        x = torch.randn(n, d, generator=generator)
        y = torch.randn(n, d, generator=generator) * scale + torch.tensor([1.0, 0, 0])
        value, se = frechet(x, y)
        estimates.append(value)
        errors.append(se)
    assert abs(np.mean(estimates) - true) < 4 * np.mean(errors) / math.sqrt(8)
    assert 0.5 < np.mean(errors) / np.std(estimates, ddof=1) < 2


def gaussian_mmd2(d: int, s1: float, s2: float, shift: float, h: float) -> float:
    """MMD^2 between N(0, s1^2 I) and N(shift e_1, s2^2 I) with kernel exp(-|x-y|^2 / (2 h^2)):
    E k(x, y) = (h^2 / (h^2 + a^2 + b^2))^(d/2) exp(-|m|^2 / (2 (h^2 + a^2 + b^2)))."""
    def expected(a, b, m):
        v = h * h + a * a + b * b
        return (h * h / v) ** (d / 2) * math.exp(-m * m / (2 * v))
    return expected(s1, s1, 0) + expected(s2, s2, 0) - 2 * expected(s1, s2, shift)


def test_the_unbiased_mmd_has_its_closed_form_and_its_noise():
    generator = torch.Generator().manual_seed(0)
    d, n, m, h = 4, 600, 400, 2.0
    true = gaussian_mmd2(d, 1.0, 1.3, 0.5, h)
    estimates, errors = [], []
    for _ in range(10):
        x = torch.randn(n, d, generator=generator)
        y = 1.3 * torch.randn(m, d, generator=generator) + torch.tensor([0.5, 0, 0, 0])
        value, se = mmd2(x, y, h)
        estimates.append(value)
        errors.append(se)
    assert abs(np.mean(estimates) - true) < 4 * np.mean(errors) / math.sqrt(10)
    assert 0.5 < np.mean(errors) / np.std(estimates, ddof=1) < 2
    # the same distribution: 0 in expectation, so within a few standard errors of 0
    same, se = mmd2(torch.randn(n, d, generator=generator), torch.randn(m, d, generator=generator), h)
    assert abs(same) < 4 * se


def test_the_mmd_matches_a_direct_sum_on_a_tiny_case():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(5, 2, generator=generator, dtype=torch.float64)
    y = torch.randn(4, 2, generator=generator, dtype=torch.float64)
    k = lambda a, b: math.exp(-float((a - b).square().sum()) / (2 * 0.7 ** 2))  # noqa: E731
    xx = sum(k(x[i], x[j]) for i in range(5) for j in range(5) if i != j) / 20
    yy = sum(k(y[i], y[j]) for i in range(4) for j in range(4) if i != j) / 12
    xy = sum(k(x[i], y[j]) for i in range(5) for j in range(4)) / 20
    assert mmd2(x, y, 0.7)[0] == pytest.approx(xx + yy - 2 * xy, rel=1e-10)


def test_token_entropy_and_generative_nll():
    tokens = torch.tensor([[3, 3, 3, 3], [1, 2, 3, 4], [5, 5, 6, 6]])
    torch.testing.assert_close(token_entropy(tokens).float(),
                               torch.tensor([0.0, math.log(4), math.log(2)]))
    model = LTM(ModelConfig(vocab_size=16, n_layers=1, d_model=8, n_heads=2, max_seq_len=16)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()  # uniform logits: every token costs log(16)
    torch.testing.assert_close(generative_nll(model, 0, tokens), torch.full((3,), math.log(16)))


@pytest.mark.parametrize("mapping,message", [
    ({"eval_steps": [0, 5]}, "prior.bench.eval_steps: must all be >= 1"),
    ({"samples": 2}, "prior.bench.samples: must be >= 4"),
    ({"scales": [0.0]}, "prior.bench.scales: must all be > 0"),
])
def test_bad_params_are_one_line(mapping, message):
    with pytest.raises(ParamsError, match=message.replace(".", r"\.").replace("[", r"\[")):
        from_mapping(PriorBench, mapping, "prior.bench")


# ---------------------------------------------------------------------------------------------
# The whole path on tiny models


PRIOR = {"patch": 4, "width": 16, "n_heads": 2, "depth": 1, "steps": 30, "batch_size": 16,
         "train_sequences": 24, "heldout_sequences": 24, "fit_batch": 8, "train_timesteps": 50,
         "sample_steps": 5, "checkpoint_every": 10, "warmup_steps": 2}
BENCH = {"eval_steps": [2, 5], "baseline_steps": 50, "samples": 8, "new_tokens": 6,
         "pca_dims": 3, "repeats": 1}


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    """A token cache, an untrained plain model and a latent one saved as the train stage saves
    them (the latent one in its counterpart folder), and a params file."""
    root = tmp_path_factory.mktemp("prior_bench")
    corpus = root / "corpus"
    corpus.mkdir()
    rng = np.random.default_rng(0)
    words = ["king", "queen", "crown", "sword", "night", "love", "death", "the", "of", "and"]
    for i in range(4):
        (corpus / f"doc{i}.txt").write_text(" ".join(rng.choice(words, 800)) + "\n")
    cache = root / "cache"
    build_cache(DataConfig(source=str(corpus), vocab_size=300, val_fraction=0.3,
                           shard_tokens=4096, cache_dir=str(cache)), progress=False)
    model = ModelConfig(vocab_size=300, n_layers=1, d_model=8, n_heads=2, max_seq_len=32)
    for folder, n_latent in (("ckpt", 0), ("ckpt/counterpart-latent", 2)):
        cfg = dataclasses.replace(model, n_latent=n_latent)
        torch.manual_seed(0)
        train_cfg = {"seq_len": 16, "latent": to_dict(LatentConfig(steps=2))}
        ckpt.save_checkpoint(root / folder / ckpt.CHECKPOINT_FILE, {
            "model": LTM(cfg).state_dict(), "model_cfg": to_dict(cfg), "train_cfg": train_cfg})
    params = {"data": {"cache_dir": str(cache)}, "model": to_dict(model),
              "train": {"seq_len": 16, "device": "cpu"}, "prior": {**PRIOR, "bench": BENCH}}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    # the same with another benchmark setting: the prior's training is unchanged
    params["prior"]["bench"] = {**BENCH, "samples": 9}
    (root / "params-other-bench.yaml").write_text(yaml.safe_dump(params))
    return root


def test_the_train_stage_trains_a_prior_and_the_benchmark_measures_it(stage):
    said = []
    trained = prior_stage(stage / "params.yaml", stage / "ckpt", stage / "prior_train.json",
                          say=said.append)
    assert trained["latent_model"] == "counterpart-latent" and trained["plain_model"] == "."
    assert trained["steps"] == 30 and trained["posterior_inner_steps"] == 2
    assert json.loads((stage / "prior_train.json").read_text())["steps"] == 30
    # again, with another prior.bench: the posteriors are read back and the finished prior is
    # resumed, not retrained (its benchmark's settings are no part of its training)
    again = prior_stage(stage / "params-other-bench.yaml", stage / "ckpt",
                        stage / "prior_train.json", say=said.append)
    assert again["run"] == "resumed at step 30"
    assert not any("fitted" in line for line in said[2:])

    table, metrics = prior_benchmark(stage / "params.yaml", stage / "ckpt",
                                     stage / "prior.json", stage / "prior.csv")
    labels = list(table["source"] + " " + table["sampler"] + " " + table["evaluations"].astype(str))
    assert labels[:3] == ["prior DDPM (ancestral) 50.0", "prior DPM-Solver++ 2.0",
                          "prior DPM-Solver++ 5.0"]
    assert set(table["source"]) >= {"N(0, I) x0.5", "N(0, I) x1", "N(mean, std) fit", "plain LM",
                                    "held-out text",
                                    "posterior (held-out)", "posterior (train split)"}
    z_rows = table[table["sampler"] != "data"].iloc[:-1]
    assert z_rows[["mmd2", "mmd2_noise", "fd_pca", "gen_ppl", "token_entropy"]].notna().all().all()
    assert metrics["reference_samples"] == 16
    assert set(metrics["by_source"]) >= {"prior DDPM 50", "prior DPM-Solver++ 5", "plain LM"}
    assert "prior_beats_best_gaussian" in metrics and "prior_beats_diagonal_fit" in metrics
    section = prior_section(stage, stage)
    # the sources' table, DPM-Solver++ against DDPM (ratios) and the pairwise verdicts
    assert len(section.figures) == 1 and len(section.tables) == 3
    ratios, verdicts = section.tables[1:]
    assert set(ratios["DPM-Solver++ evaluations"]) == {
        int(k[3:].split("_")[0]) for k in metrics if k.startswith("dpm") and k.endswith("_mmd2_ratio_to_ddpm")}
    assert set(verdicts.columns) == {"comparison"} | set(metrics["verdicts"])


def test_without_a_prior_the_benchmark_writes_a_header_and_says_why(tmp_path, stage):
    table, metrics = prior_benchmark(stage / "params.yaml", tmp_path, tmp_path / "prior.json",
                                     tmp_path / "prior.csv")
    assert table.empty and "no trained prior" in metrics["skipped"]
    assert (tmp_path / "prior.csv").read_text().startswith("source,sampler,evaluations")
    assert "No prior results: no trained prior" in prior_section(tmp_path, tmp_path).note


def test_the_diagonal_fit_draws_the_normalisation_gaussian():
    # the baseline that tells the prior's network from its normalisation: z ~ N(mean, std^2)
    from types import SimpleNamespace

    from ltm.bench.prior import DIAGONAL_FIT, PriorBench, _z_sources
    mean, std = torch.randn(3, 8), torch.rand(3, 8) + 0.5
    prior = SimpleNamespace(mean=mean, std=std, denoiser=SimpleNamespace(slots=3, dim=8),
                            basis=None)
    cfg = PriorBench(samples=4000, eval_steps=[5], scales=[1.0])
    heads = [head["source"] for head, _, _ in _z_sources(cfg, prior, {}, 0)]
    assert not any("rank" in source for source in heads)  # no whitening, no low-rank row
    (draw,) = [d for head, d, _ in _z_sources(cfg, prior, {}, 0) if head["source"] == DIAGONAL_FIT]
    z = draw()
    assert z.shape == (4000, 3, 8)
    # 4000 draws: the standard error of a mean is std / 63, of a std about std / 89
    assert torch.allclose(z.mean(0), mean, atol=4 * 1.5 / 63)
    assert torch.allclose(z.std(0) / std, torch.ones(3, 8), atol=0.06)


def test_the_low_rank_fit_row_draws_the_priors_own_gaussian():
    # with a whitening, a row draws what the untrained denoiser would: Prior.decode of N(0, I)
    from ltm.bench.prior import PriorBench, _z_sources
    from ltm.latent.prior import Denoiser, Prior, PriorConfig

    basis = torch.zeros(1, 24)
    basis[0, :8] = 8 ** -0.5
    prior = Prior(Denoiser(3, 8, PriorConfig(width=16, n_heads=2)), PriorConfig(),
                  torch.randn(3, 8), torch.rand(3, 8) + 0.5, basis, torch.tensor([3.0]))
    cfg = PriorBench(samples=4000, eval_steps=[5], scales=[1.0])
    (draw,) = [d for head, d, _ in _z_sources(cfg, prior, {}, 0)
               if head["source"] == "rank-1 + diagonal fit"]
    x = ((draw() - prior.mean) / prior.std).flatten(1)
    assert abs(float((x @ basis.t()).std()) / 3 - 1) < 0.05  # standard error about 0.011


@pytest.mark.parametrize("a,b,expected", [
    (1.0, 2.0, "better"), (2.0, 1.0, "worse"), (1.0, 1.1, "tie")])
def test_a_verdict_needs_twice_the_combined_noise(a, b, expected):
    from ltm.bench.prior import verdict
    noise = 0.1 / math.sqrt(2)  # combined: 0.1, so a gap of 0.2 is the threshold
    assert verdict({"mmd2": a, "mmd2_noise": noise}, {"mmd2": b, "mmd2_noise": noise},
                   "mmd2") == expected
