"""The report's HTML: one self-contained page (figures as embedded PNG, no script or font from the
internet), the headline box and a table of contents before the sections."""
from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass, replace

import pandas as pd
from matplotlib.figure import Figure

from ltm.report.gpu import Section


def human(x) -> str:
    """Numbers for people: thousands separated, four significant digits, no exponent below 1e9."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    if x != x:  # NaN
        return ""
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.4g}"


@dataclass(repr=False)
class RenderedFigure:
    """A figure drawn once: the page embeds its PNG and the notebook shows the same bytes
    (`_repr_png_`), where displaying the Figure would draw it again, twice for a tight box."""

    figure: Figure
    png: bytes

    @property
    def axes(self) -> list:
        return self.figure.axes

    def _repr_png_(self) -> bytes:
        return self.png

    def __repr__(self) -> str:
        return f"<figure, {len(self.png):,} bytes of PNG>"


def render_figure(fig: Figure | RenderedFigure, dpi: int) -> RenderedFigure:
    """`fig` as PNG at `dpi`; an already rendered figure as it is."""
    if isinstance(fig, RenderedFigure):
        return fig
    buffer = io.BytesIO()
    # a figure with a layout engine already fits its canvas: a tight box would lay it out and
    # draw it a second time
    tight = "tight" if fig.get_layout_engine() is None else None
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches=tight)
    return RenderedFigure(fig, buffer.getvalue())


def rendered_sections(sections: list[Section], dpi: int) -> list[Section]:
    """The sections with every figure drawn once (`render_figure`)."""
    return [replace(s, figures=[render_figure(f, dpi) for f in s.figures]) for s in sections]


def _figure_html(fig: Figure | RenderedFigure, dpi: int) -> str:
    encoded = base64.b64encode(render_figure(fig, dpi).png).decode()
    return f'<img alt="figure" src="data:image/png;base64,{encoded}">'


def _anchor(title: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in title.lower()).strip("-")


def _table_html(table: pd.DataFrame) -> str:
    # numbers in mixed (object) columns formatted like the float columns' (pandas applies
    # float_format to float columns only)
    table = table.apply(lambda col: col.map(lambda v: human(v) if isinstance(v, float) else v)
                        if col.dtype == object else col)
    # no index column; a wide table scrolls inside its box, never the page
    body = table.to_html(float_format=human, border=0, na_rep="", index=False)
    # pandas writes a newline inside a cell as the two characters \\n (generated text is full of
    # them): a line break on the page
    return '<div class=tw>' + body.replace("\\n", "<br>") + "</div>"


def _section_html(section: Section, dpi: int) -> str:
    parts = [f'<h2 id="{_anchor(section.title)}">{html.escape(section.title)}</h2>']
    note, details = section.note or "", ""
    if section.folded:  # a folded section's first sentence shows, the rest (record lists) folds
        head, sep, rest = note.partition(". ")
        note, details = (head + "." if sep else head), rest
    if note:
        parts.append(f"<p>{html.escape(note)}</p>")
    # figures, then tables, each in a row that wraps: narrow ones sit side by side
    body = [f"<div class=row>{''.join(items)}</div>" for items in (
        [_figure_html(fig, dpi) for fig in section.figures],
        [_table_html(table) for table in section.tables]) if items]
    if section.folded and (body or details):
        count = f"{len(section.figures)} figures, {len(section.tables)} tables"
        body = ([f"<details><summary>show ({count})</summary>"]
                + ([f"<p>{html.escape(details)}</p>"] if details else []) + body + ["</details>"])
    return "".join(parts + body)


def render_html(title: str, sections: list[Section], env: dict, dpi: int,
                headline: list[str] = ()) -> str:
    """The page: title, environment, the headline box, a table of contents, the sections."""
    parts = [f"<h1>{html.escape(title)}</h1>",
             "<p class=env>" + " · ".join(f"{k}: {html.escape(str(v))}" for k, v in env.items()) + "</p>"]
    if headline:
        parts.append("<div class=headline><ul>" + "".join(f"<li>{html.escape(line)}</li>"
                                                         for line in headline) + "</ul></div>")
    parts.append("<nav><b>Contents</b><ol>" + "".join(
        f'<li><a href="#{_anchor(s.title)}">{html.escape(s.title)}</a></li>' for s in sections)
        + "</ol></nav>")
    parts += [_section_html(section, dpi) for section in sections]
    # the page fills a 1440-px window (two 650-px figures side by side); prose keeps a readable
    # line length
    style = ("body{font-family:sans-serif;max-width:1380px;margin:1.5em auto;padding:0 1em;color:#222}"
             "p{max-width:1100px}.row{display:flex;flex-wrap:wrap;gap:0.5em 2em;"
             "align-items:flex-start}.row>*{min-width:0}"
             "table{border-collapse:collapse;font-size:0.85em;margin:1em 0}"
             "td,th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right;"
             "max-width:24em;overflow-wrap:break-word}"
             ".tw{overflow-x:auto;max-width:100%}"
             ".headline{border:2px solid #1f77b4;border-radius:6px;padding:0.2em 1em;"
             "background:#f4f8fc;font-size:0.95em}.headline li{margin:0.3em 0}"
             "nav{font-size:0.9em;columns:3}nav ol{margin:0.3em 0}"
             ".env{color:#666;font-size:0.85em}img{max-width:100%}")
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n")
