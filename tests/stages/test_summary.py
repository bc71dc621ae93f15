"""ltm.stages.summary: each stage's headline metrics, few and named for whose they are."""
import json

from ltm.stages.summary import (ablate_summary, benchmark_summary, read_results, recall_summary,
                                study_summary, tokenize_summary, train_summary, write_summary)


def _leaves(tree) -> int:
    return sum(_leaves(v) for v in tree.values()) if isinstance(tree, dict) else 1


PLAIN = {"mixer": "attention", "n_latent": 0, "params": 1000, "val_loss": 5.531598, "val_loss_noise": 0.0107,
         "val_prefix_nll": 5.5195, "val_prefix_nll_noise": 0.0129, "tokens_per_s": 7187.5,
         "tokens_per_s_noise": 4787.8, "peak_memory_mib": 741.2, "seconds": 57.99,
         "train_loss": 5.2, "switches": {"amp": "off"}, "comparison": [{"model": "plain"}]}
LATENT = dict(PLAIN, n_latent=4, val_loss=20.58, val_loss_noise=0.011)


def test_a_plain_models_nll_and_a_latent_models_bound_never_share_a_name():
    plain = train_summary(dict(PLAIN, counterparts={"latent": LATENT}))
    assert plain["lm"]["val_nll"] == 5.5316 and "val_nll_bound" not in plain["lm"]
    assert plain["counterparts"]["latent"]["val_nll_bound"] == 20.58
    assert "val_nll" not in plain["counterparts"]["latent"]
    latent = train_summary(LATENT)
    assert latent["lm"]["val_nll_bound"] == 20.58 and "val_nll" not in latent["lm"]
    # how the model's tokens/s was measured goes with it (the report compares only alike runs)
    assert "models_at_once" not in plain["lm"]
    assert train_summary(dict(PLAIN, models_at_once=2))["lm"]["models_at_once"] == 2
    assert latent["lm"]["model"] == "attention + 4 latents"


def test_the_train_headline_is_tens_of_numbers_with_the_prior_and_the_study_s_apart():
    study = {"enabled": True, "sources": {"testbed": {"gain_over": {
        "plain": {"mean": 0.2957, "se": 0.0079, "z": 37.2}, "shuffled": {"mean": 0.677, "se": 0.025}}}}}
    prior = {"enabled": True, "eval_loss_heldout": 0.2474, "eval_loss_train": 0.2374,
             "train_loss_first": 0.25}
    prior_bench = {"fewest_dpm_evaluations_matching_ddpm": 5, "prior_mmd2_over_best_gaussian": 0.12441}
    summary = train_summary(dict(PLAIN, counterparts={"latent": LATENT, "plain-equal-flops": PLAIN}),
                            prior, prior_bench)
    # the prior trains and is measured in the train stage: both halves in its headline
    assert summary["prior"] == {"loss_heldout": 0.2474, "loss_train": 0.2374,
                                "fewest_solver_evaluations_matching_ddpm": 5,
                                "mmd2_over_best_gaussian": 0.124}
    assert "study" not in summary
    assert study_summary(study)["testbed"] == {"latent_gain_over_plain": 0.2957,
                                           "latent_gain_over_plain_noise": 0.0079,
                                           "own_z_gain_over_shuffled": 0.677,
                                           "own_z_gain_over_shuffled_noise": 0.025}
    # speed and noise only for the model; a counterpart's loss and prefix NLL
    assert summary["counterparts"]["latent"] == {"model": "attention + 4 latents",
                                                 "val_nll_bound": 20.58, "val_prefix_nll": 5.5195}
    assert _leaves(summary) <= 40


def test_ablate_and_benchmark_headlines():
    ablate = {"baseline": {"verdict": "BASELINE", "speedup": 1.0, "step_ms": 124.36, "val_loss": 5.4},
              "train.opt.amp=bf16": {"verdict": "SLOWER", "speedup": 0.0635162, "step_ms": 2234.7},
              "profile": {"baseline": {"MLP": 35.7}}, "protocol": {"device": "cpu"}}
    assert ablate_summary(ablate) == {"baseline": {"step_ms": 124.4},
                                      "train.opt.amp=bf16": {"verdict": "SLOWER", "speedup": 0.064}}
    bench = {"device": "cpu", "torch": "2.13.0", "chunk_vs_naive_forward": {"rwkv7": 4.8}}
    assert benchmark_summary(bench) == {"device": "cpu", "chunk_vs_naive_forward": {"rwkv7": 4.8}}
    recall = {"enabled": True, "by_mixer": {"rwkv7": {"params": 9, "beyond_window": {
        "accuracy": 0.5, "se": 0.01, "n": 100}}}}
    assert recall_summary(recall)["recall_beyond_window"] == {
        "rwkv7": {"accuracy": 0.5, "accuracy_noise": 0.01}}
    assert "recall_margin_over_sliding_window" not in recall_summary(recall)
    recall["margins_over_sliding_window"] = {"titans:window": {"difference": 0.07, "se": 0.01,
                                                               "per_seed": [0.06, 0.08]}}
    assert recall_summary(recall)["recall_margin_over_sliding_window"] == {
        "titans:window": {"difference": 0.07, "difference_noise": 0.01}}
    assert recall_summary({"enabled": False}) == {}
    assert tokenize_summary({"tokens": 10, "seconds": 3.0}) == {"tokens": 10}


def test_write_and_read(tmp_path):
    path = tmp_path / "m" / "train.json"
    write_summary(path, {"lm": {"val_nll": 1.0}})
    assert json.loads(path.read_text()) == {"lm": {"val_nll": 1.0}}
    assert read_results(path) == {"lm": {"val_nll": 1.0}} and read_results(tmp_path / "none") is None
