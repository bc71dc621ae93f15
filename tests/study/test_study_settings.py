"""ltm.study.settings: the study section's values are checked, one line each."""
import pytest

from ltm.params import ParamsError, from_mapping
from ltm.study.settings import StudyConfig


@pytest.mark.parametrize("mapping, message", [
    ({"sources": ["testbed", "corpse"]}, r"^study.sources\[1\]: expected 'testbed' or 'corpus'"),
    ({"window": 0}, r"^study.window: must be >= 1"),
    ({"d_model": 30, "n_heads": 4}, r"^study.n_heads: must divide d_model 30"),
    ({"dynamic_lrs": []}, r"^study.dynamic_lrs: must be positive"),
    ({"cold_curve": [-1]}, r"^study.cold_curve: must list inference steps >= 0"),
    ({"stpes": 3}, r"^study"),
])
def test_bad_values_fail_with_one_line(mapping, message):
    with pytest.raises(ParamsError, match=message):
        from_mapping(StudyConfig, mapping, "study")


def test_the_defaults_study_both_sources():
    assert StudyConfig().sources == ["testbed", "corpus"]
