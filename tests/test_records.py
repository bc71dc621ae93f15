import json

import pytest

from ltm.records import read_records


def test_records_come_by_file_name_with_their_content(tmp_path):
    (tmp_path / "b.json").write_text(json.dumps({"device": "GPU B", "runs": [1]}))
    (tmp_path / "a.json").write_text(json.dumps({"device": "GPU A", "runs": []}))
    (tmp_path / "notes.txt").write_text("not JSON, not read")
    records = read_records(tmp_path, "runs", "training")
    assert [(path.name, record["device"]) for path, record in records] == [("a.json", "GPU A"),
                                                                          ("b.json", "GPU B")]
    assert read_records(tmp_path / "missing", "runs", "training") == []


@pytest.mark.parametrize("text", ['{"device": "GPU", "rows": []}', '{"runs": []}', "[1, 2]",
                                  "{not json"], ids=["other-key", "no-device", "a-list", "broken"])
def test_a_file_that_is_no_record_is_named(tmp_path, text):
    (tmp_path / "x.json").write_text(text)
    with pytest.raises(ValueError, match=r"x\.json: not a training record \("):
        read_records(tmp_path, "runs", "training")
