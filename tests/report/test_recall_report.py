"""ltm.report.recall: the report's recall section shows the figure and the table, or says why there
is nothing to show (the figure and summary line: tests/report/test_recall_figure.py)."""
import json

from ltm.report.recall import recall_section

from test_recall_figure import metrics, table


def test_the_section_shows_the_figure_and_table_or_says_why_not(tmp_path):
    assert "wrote no recall.json" in recall_section(tmp_path, tmp_path).note
    (tmp_path / "recall.json").write_text(json.dumps({"enabled": False}))
    assert "benchmark.recall.enabled is false" in recall_section(tmp_path, tmp_path).note
    (tmp_path / "recall.json").write_text(json.dumps(metrics()))
    table().to_csv(tmp_path / "recall.csv", index=False)
    section = recall_section(tmp_path, tmp_path, "abc")
    assert section.note.startswith("Recall beyond the 16-token window: best attention")
    assert len(section.figures) == 1 and len(section.tables[0]) == 12
    assert list(section.tables[0].columns) == ["mixer", "params", "bin", "accuracy", "se", "n"]
