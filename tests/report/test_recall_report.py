"""ltm.report.recall: the report's recall section shows the figure and the table, or says why there
is nothing to show (the figure and summary line: tests/report/test_recall_figure.py)."""
import json

from ltm.report.recall import recall_section

from test_recall_figure import metrics, table


def test_the_section_shows_the_figure_and_table_or_says_why_not(tmp_path):
    assert "wrote no recall.json" in recall_section(tmp_path, tmp_path).note
    (tmp_path / "recall.json").write_text(json.dumps({"enabled": False}))
    assert "recall.enabled is false" in recall_section(tmp_path, tmp_path).note
    (tmp_path / "recall.json").write_text(json.dumps(metrics()))
    table().to_csv(tmp_path / "recall.csv", index=False)
    section = recall_section(tmp_path, tmp_path, "abc")
    assert section.note.startswith("Recall beyond the 16-token window: best attention")
    assert len(section.figures) == 1 and len(section.tables[0]) == 12
    assert list(section.tables[0].columns) == ["mixer", "params", "bin", "accuracy", "se", "n"]


def test_the_section_reads_the_file_the_stage_writes(tmp_path):
    """recall.json as the stage writes it: its settings repeat `enabled` (the stage's dump of
    benchmark.recall), which once broke the note's formatting."""
    written = metrics()
    written["settings"] = dict(written.get("settings", {}), enabled=True)
    (tmp_path / "recall.json").write_text(json.dumps(written))
    table().to_csv(tmp_path / "recall.csv", index=False)
    assert "held-out sequences" in recall_section(tmp_path, tmp_path, "abc").note
