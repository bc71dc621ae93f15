"""ltm.ablation.switches: a switch applied to a copy of the sections, its kind and tolerance from
the registry, and one-line errors for a bad switch or registry entry."""
import pytest

from ltm.ablation.switches import AblateConfig, apply_switch, describe_change
from ltm.params import ParamsError, from_mapping

SECTIONS = {"model": {"mixer": "attention", "kernel": "torch"}, "train": {"opt": {"amp": "off"}}}


def test_switch_applies_one_or_more_assignments_to_a_copy():
    changed = apply_switch(SECTIONS, "model.mixer=deltanet model.kernel=naive train.opt.amp=bf16", "s")
    assert changed["model"] == {"mixer": "deltanet", "kernel": "naive"}
    assert changed["train"]["opt"]["amp"] == "bf16"
    assert SECTIONS["model"]["mixer"] == "attention"


@pytest.mark.parametrize("switch, message", [
    ("data.vocab_size=10", "must change the model or train section"),
    ("model.mixer", "not of the form section.key=value"),
    ("model.mixer.x=1", "goes below the plain value"),
])
def test_bad_switches_are_one_line_errors(switch, message):
    with pytest.raises(ParamsError, match=message):
        apply_switch(SECTIONS, switch, "ablate.switches[0]")


def test_each_switch_declares_its_kind_and_tolerance():
    cfg = AblateConfig(exact_tolerance=0.001, loss_tolerance=0.05,
                       registry={"model.norm_eps": {"kind": "approximate", "tolerance": 0.2}})
    fused = describe_change("train.opt.fused_loss=true", cfg, "s")
    assert (fused.kind, fused.tolerance) == ("exact", 0.001)
    # one approximate assignment makes the change approximate
    mixed = describe_change("model.mixer=deltanet model.kernel=naive", cfg, "s")
    assert (mixed.kind, mixed.tolerance) == ("approximate", 0.05)
    assert describe_change("model.norm_eps=1", cfg, "s").tolerance == 0.2
    with pytest.raises(ParamsError, match="'model.init_std' is not in the switch registry"):
        describe_change("model.init_std=0.1", AblateConfig(), "ablate.switches[0]")


def test_a_bad_registry_entry_is_a_one_line_error():
    with pytest.raises(ParamsError, match=r"ablate.registry.model.x: expected \{kind"):
        from_mapping(AblateConfig, {"registry": {"model.x": {"kind": "maybe"}}}, "ablate")


def test_time_budget_must_be_positive():
    with pytest.raises(ParamsError, match="time_budget_s: must be > 0 or null"):
        AblateConfig(time_budget_s=0)
