"""ltm.study.contenders: parameter matching, the shared-z control, equal batches and the
equal-FLOPs model, trained here or in worker processes alike."""
import dataclasses

import numpy as np
import torch

from ltm.data.cache import DataConfig
from ltm.data.synthetic import SyntheticConfig
from ltm.latent.encoder import attach_encoder
from ltm.model.lm import LTM
from ltm.study.contenders import (SharedLatents, choose_inner_lr, decoder_config, latent_config,
                                  matched_d_ff, non_embedding_params, plan_contenders,
                                  train_contenders, train_model, train_sources)
from ltm.study.scoring import Scored
from ltm.study.settings import StudyConfig
from ltm.study.sources import synthetic_source
from ltm.train.objective import LossModel

SYN = SyntheticConfig(topics=2, symbols=6, length=16, train_sequences=64, val_sequences=8)
CFG = StudyConfig(d_model=16, n_heads=2, n_latent=2, steps=6, batch_size=4, warmup_steps=2,
                  val_sequences=8, inner_steps=1, workers=1, seeds=1, inner_lrs=[0.3])


def source(seed: int = 1337):
    data = DataConfig(source="synthetic", synthetic=SYN, cache_dir="unused", seed=seed)
    return synthetic_source(data, CFG)


def test_the_plain_model_gets_as_many_parameters_as_the_latent_one_within_one_width_step():
    latent = attach_encoder(LTM(decoder_config(CFG, 7, 16, CFG.n_latent)), latent_config(CFG))
    target = non_embedding_params(latent)
    plain = LTM(decoder_config(CFG, 7, 16, 0, d_ff=matched_d_ff(CFG, 7, 16, target)))
    # one step of d_ff (8 units) is 3 * d_model * 8 weights per layer
    assert abs(plain.num_params() - target) <= 3 * CFG.d_model * 8 * CFG.n_layers / 2 + 1
    assert plain.cfg.window == CFG.window and plain.cfg.n_latent == 0


def test_the_shared_control_feeds_one_trained_z_to_every_sequence():
    shared = SharedLatents(LTM(decoder_config(CFG, 7, 16, CFG.n_latent)))
    z = shared.latents(3)
    assert z.shape == (3, CFG.n_layers * CFG.n_latent, CFG.d_model) and torch.equal(z[0], z[2])
    x = torch.randint(7, (3, 16))
    shared(x, x).backward()
    assert shared.z.grad is not None and shared.z.grad.abs().sum() > 0


def test_every_model_sees_the_same_batches_and_the_loss_falls():
    src = source()
    losses = []
    for _ in range(2):
        torch.manual_seed(0)
        model = LTM(decoder_config(CFG, src.vocab_size, 16, 0))
        losses.append(train_model(LossModel(model, False, False), src, CFG, 40, "t", progress=False))
    assert losses[0] == losses[1]  # same start, same batches: the same run
    assert losses[0] < torch.log(torch.tensor(float(src.vocab_size))).item()


def test_the_contenders_are_trained_the_same_in_worker_processes_as_here():
    src, two = source(), dataclasses.replace(CFG, seeds=2)
    here = train_contenders(src, two, progress=False, say=lambda *a: None)  # one worker: here
    assert len(here) == 2
    for c in here:
        assert set(c.train_loss) == {"latent", "plain", "shared", "plain_equal_flops"}
        assert c.equal_flops is not None and c.equal_flops_steps > CFG.steps  # inference costs FLOPs
        assert c.latent.encoder is not None and c.plain.cfg.n_latent == 0
    # a second seed: new weights and batches
    assert here[0].train_loss["plain"] != here[1].train_loss["plain"]
    said = []
    spread = train_contenders(src, dataclasses.replace(two, workers=2), progress=False,
                              say=said.append)
    # each contender seeds itself: the same losses and weights up to the rounding of a different
    # thread count, whichever process trained it
    for a, b in zip(here, spread):
        for name, loss in a.train_loss.items():
            assert abs(b.train_loss[name] - loss) < 1e-4, name
        for wa, wb in zip(a.latent.state_dict().values(), b.latent.state_dict().values()):
            torch.testing.assert_close(wa, wb, rtol=1e-4, atol=1e-5)
        # ... and scored alike where they trained: every control, per sequence
        assert set(a.scores) == set(b.scores) == {"latent", "shuffled", "plain", "dynamic",
                                                  "shared", "plain_equal_flops"}
        for name, per_sequence in a.scores.items():
            assert per_sequence.shape == (len(src.val_x),)
            torch.testing.assert_close(torch.as_tensor(b.scores[name]), torch.as_tensor(per_sequence),
                                       rtol=1e-4, atol=1e-5)
    # the curves and raw bounds: the first seed's latent model only
    assert here[0].curves and set(here[0].bounds) == {"reused_noise", "fresh_noise", "iwae"}
    assert here[1].curves is None and here[1].bounds is None
    assert sorted(line.split(":")[1].strip() for line in said) == sorted(
        f"{label} (seed {seed}{', inner lr 0.3' if label == 'latent' else ''})" for seed in (0, 1)
        for label in ("latent", "plain", "shared z", "plain, equal FLOPs"))


def test_the_equal_flops_model_is_skipped_over_its_cap():
    src = source()
    assert "plain_equal_flops" in plan_contenders(src, CFG).names
    capped = dataclasses.replace(CFG, max_equal_flops_steps=CFG.steps)
    plan = plan_contenders(src, capped)
    assert plan.names == ["latent", "plain", "shared"] and plan.steps["plain_equal_flops"] > CFG.steps
    [c] = train_contenders(src, capped, progress=False, say=lambda *a: None)
    assert c.equal_flops is None and "skipped" in c.notes[0] and "plain_equal_flops" not in c.train_loss


def test_the_inner_step_size_is_the_pilot_with_the_lowest_training_loss_whatever_it_scores():
    # (weights, training loss, seconds, scores) as train_contender returns them: the second
    # trained best and scored worst
    pilots = [({}, loss, 1.0, Scored({"latent": np.full(4, nll)}))
              for loss, nll in ((3.2, 5.0), (3.1, 6.0), (3.3, 4.0))]
    best, chosen = choose_inner_lr([0.3, 0.1, 0.03], pilots)
    assert best == 1 and chosen["chosen"] == 0.1
    assert [p["suffix_nll"] for p in chosen["pilots"]] == [5.0, 6.0, 4.0]


def test_the_other_seeds_train_at_the_chosen_step_size_and_the_curves_are_the_chosen_pilots():
    src, said = source(), []
    two = dataclasses.replace(CFG, seeds=2, inner_lrs=[3.0, 0.001])
    runs = train_contenders(src, two, progress=False, say=said.append)
    pilots = runs[0].inner_lr["pilots"]
    best = min(pilots, key=lambda p: p["train_loss"])
    assert [p["lr"] for p in pilots] == [3.0, 0.001] and pilots[0]["train_loss"] != pilots[1]["train_loss"]
    assert runs[0].inner_lr["chosen"] == runs[1].inner_lr["chosen"] == best["lr"]
    # the first seed's latent model is the chosen pilot: its loss and scores
    assert runs[0].train_loss["latent"] == best["train_loss"]
    assert abs(float(runs[0].scores["latent"].mean()) - best["suffix_nll"]) < 1e-9
    assert runs[0].curves and runs[1].curves is None and set(runs[0].bounds) == {
        "reused_noise", "fresh_noise", "iwae"}
    assert f"latent (seed 1, inner lr {best['lr']})" in [line.split(":")[1].strip() for line in said]
    assert sum(", inner lr" in line for line in said) == 3  # two pilots and seed 1


def test_sources_pooled_in_one_round_train_and_score_as_each_alone():
    """train_sources runs every source's jobs in one pool per round: each source gets back its
    own contenders, pilots and curves, as if trained alone (distinct sources, so a mix-up shows)."""
    # two rounds (pilots, then the chosen one's curves), short curves
    cfg = dataclasses.replace(CFG, inner_lrs=[3.0, 0.001], encoder_curve=[0, 1], cold_curve=[0, 2],
                              dynamic_lrs=[0.1])
    sources = [source(1), dataclasses.replace(source(2), name="other")]
    pooled = train_sources(sources, cfg, progress=False, say=lambda *a: None)
    assert pooled[0][0].train_loss["plain"] != pooled[1][0].train_loss["plain"]
    for src, runs in zip(sources, pooled):
        alone = train_contenders(src, cfg, progress=False, say=lambda *a: None)
        assert [r.inner_lr for r in runs] == [r.inner_lr for r in alone]
        untimed = lambda rows: [{k: v for k, v in r.items() if k != "ms_per_sequence"}  # noqa: E731
                                for r in rows or []]
        for a, b in zip(alone, runs):
            assert a.train_loss == b.train_loss and untimed(a.curves) == untimed(b.curves)
            for name, per_sequence in a.scores.items():
                np.testing.assert_array_equal(b.scores[name], per_sequence)
