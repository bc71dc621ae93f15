"""tests.report.layout: the report page's structure at a 1440-px window, on a small page built here
through ltm.report.render and on reports/report.html where the pipeline has built it. The
targets are the page's: at most 12,000 px tall, no sideways scroll, the headline box first and
within the first screen, no figure shrunk until its text cannot be read."""
from __future__ import annotations

import base64
import io
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.figure import Figure

from ltm.report.gpu import Section
from ltm.report.render import render_html
from tests.report.layout import (MAX_HEIGHT, MIN_TEXT_PX, SCREEN, FigureSize, browser,
                                 content_width, estimate, main, measure_in_chromium, png_size)

REPORT = Path(__file__).resolve().parents[2] / "reports" / "report.html"
DPI = 110


def figure(width_in: float, height_in: float = 2.5) -> Figure:
    fig = Figure(figsize=(width_in, height_in), layout="constrained")
    ax = fig.add_subplot()
    ax.plot([0, 1, 2], [2.0, 1.5, 1.2], label="loss")
    ax.set_title("validation loss")
    ax.legend(fontsize=7)
    return fig


def small_page() -> str:
    """A page shaped like the report: headline, a section with a note, figures side by side and
    one far too wide, a long table, a 30-column table, a folded history."""
    rows = pd.DataFrame({"model": [f"plain, as many parameters ({i})" for i in range(12)],
                         "suffix NLL": [3.3 + i / 100 for i in range(12)],
                         "note": ["a long note that wraps in its cell " * 3] * 12})
    wide = pd.DataFrame({f"a rather long column name {i}": [1.5, 2.25] for i in range(30)})
    sections = [
        Section("Results", [rows], [figure(4.5), figure(4.5), figure(32)],
                "Suffix NLL: the second half of each validation sequence given the first. " * 6),
        Section("Wide", [wide], []),
        Section("History", [rows], [figure(8)], "recorded elsewhere", folded=True)]
    return render_html("workbook", sections, {"commit": "abc1234", "device": "cpu"}, DPI,
                       ["what changed: nothing beyond the noise", "latents: 0.3 nats better",
                        "switches: none paid", "kernels: 1.8x the reference"])


@pytest.fixture(scope="module")
def page() -> str:
    return small_page()


def test_the_estimate_finds_the_headline_first_and_nothing_wider_than_the_column(page):
    layout = estimate(page)
    assert layout.content_width == 1380  # the page's CSS max-width at a 1440-px window
    box = layout.headline()
    assert box is not None and box.top + box.height <= SCREEN
    assert box.top < min(e.top for e in layout.elements if e.kind == "h2")
    widest = layout.widest()
    assert widest.width > 3000 and widest.shown_width == 1380  # the 32-inch figure, shrunk
    tables = [e for e in layout.elements if e.kind == "table"]
    assert max(t.width for t in tables) > 1380 >= max(t.shown_width for t in tables)  # scrolls
    assert layout.overflow() == 0 and layout.height < MAX_HEIGHT
    assert sum(e.hidden_height for e in layout.elements) > 300  # the folded history


def test_two_small_figures_share_a_line(page):
    layout = estimate(page)
    small = [f for f in layout.figures if f.width < 550]
    assert len(small) == 2  # the two 4.5-inch figures of the first section
    # the section's figures: one wrapping row (render.py puts them in a flex row)
    first = next(e for e in layout.elements if e.kind in ("figure", "div"))
    # side by side (287 px), then the wide one shrunk to 89 px under them: not 287 + 287 + 89
    assert first.height < 1.5 * small[0].height


def test_a_figure_drawn_far_wider_than_shown_is_unreadable(page):
    layout = estimate(page)
    unreadable = layout.unreadable()
    assert [f.width for f in unreadable] == [max(f.width for f in layout.figures)]
    assert all(f.dpi == pytest.approx(DPI, rel=0.01) for f in layout.figures)


def test_text_size_on_screen_follows_dpi_and_shrinking():
    shrunk = FigureSize(1, width=3300, height=300, dpi=110, shown_width=1100)
    assert shrunk.scale == pytest.approx(1 / 3)
    assert shrunk.text_px(10) == pytest.approx(10 * 110 / 72 / 3)  # 5.1 px: unreadable
    assert FigureSize(2, 600, 300, 110, 600).text_px(7) > MIN_TEXT_PX  # 10.7 px at full size


def test_png_size_reads_width_height_and_dpi():
    buffer = io.BytesIO()
    figure(3, 2).savefig(buffer, format="png", dpi=50)
    width, height, dpi = png_size("data:image/png;base64," + base64.b64encode(
        buffer.getvalue()).decode())
    assert (width, height) == (150, 100) and dpi == pytest.approx(50, rel=0.01)


def test_the_command_prints_one_line_per_measurement(page, tmp_path, capsys):
    path = tmp_path / "report.html"
    path.write_text(page)
    assert main([str(path), "--no-browser"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "estimated height", "widest element", "headline",
        "figures unreadable (10-pt text under 9 px)", "figures small text (7-pt text under 9 px)",
        "measured"]
    assert main([str(tmp_path / "missing.html")]) == 2


needs_browser = pytest.mark.skipif(browser() is None, reason="no Chromium-family browser")
needs_report = pytest.mark.skipif(not REPORT.is_file(),
                                  reason="reports/report.html not built (dvc repro)")


@needs_browser
@pytest.mark.parametrize("source", ["small page", pytest.param("report", marks=needs_report)])
def test_the_estimate_agrees_with_chromium(source, page):
    page = page if source == "small page" else REPORT.read_text()
    measured = measure_in_chromium(page)
    layout = estimate(page)
    # sideways scroll in the browser exactly where the estimate finds an overflow
    assert (measured["width"] > measured["client_width"]) == (layout.overflow() > 0)
    assert abs(layout.height - measured["height"]) < 0.03 * measured["height"] + 20
    top, bottom = measured["headline"]
    assert abs(layout.headline().top - top) < 20
    assert abs(layout.headline().height - (bottom - top)) < 0.1 * (bottom - top)


def check_targets(page: str) -> list[str]:
    """What the page misses of the targets, in words (empty: all met)."""
    layout = estimate(page)
    misses = []
    if layout.height > MAX_HEIGHT:
        misses.append(f"estimated {layout.height:,.0f} px tall (at most {MAX_HEIGHT:,})")
    if layout.overflow() > 0:
        misses.append(f"{layout.widest().kind} reaches {layout.overflow():,.0f} px past the window")
    box = layout.headline()
    if box is None or box.top + box.height > SCREEN:
        misses.append("no headline box within the first screen")
    misses += [f"figure #{f.index}: {f.width} px shown at {f.shown_width:.0f} px, 10-pt text "
               f"{f.text_px(10):.1f} px" for f in layout.unreadable()]
    return misses


def test_the_small_page_meets_the_targets_but_for_its_wide_figure(page):
    misses = check_targets(page)
    assert len(misses) == 1 and misses[0].startswith("figure #3")


@needs_report
def test_the_built_report_meets_the_targets():
    page = REPORT.read_text()
    misses = check_targets(page)
    measured = measure_in_chromium(page) if browser() else None
    if measured is not None:
        if measured["height"] > MAX_HEIGHT:
            misses.append(f"Chromium: {measured['height']:,} px tall")
        if measured["width"] > measured["client_width"]:
            misses.append(f"Chromium: {measured['width']:,} px wide, scrolls sideways")
    assert not misses, "reports/report.html: " + "; ".join(misses)


def test_the_column_follows_the_pages_css():
    assert content_width("body{max-width:1100px;margin:2em auto}") == 1100
    assert content_width("body{max-width:1400px;margin:2em auto}", 1280) == 1280
    assert content_width("body{margin:0 2em}") == 1440 - 64
    assert content_width("") == 1440 - 16  # the browser's 8-px default margin
