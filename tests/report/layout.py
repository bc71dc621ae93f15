"""How the report page lays out in a browser window, measured from its HTML alone: the page's
height (from each figure's intrinsic size and each table's rows), its widest element, where the
headline box sits, and which figures are shrunk so much that their text cannot be read. Where
Chromium is installed, `measure_in_chromium` gives the browser's own numbers.

    python -m tests.report.layout reports/report.html [--window 1440] [--no-browser]

The estimate follows the browser's rules for this page's simple structure (blocks one under the
other, images inline, tables in auto layout, a closed <details> shows its summary only) with the
metrics of the default sans-serif (Arial's, which Liberation Sans and Helvetica share); it is
meant to land within a few percent of the browser, not to replace it.

A test instrument, not part of the product: no pipeline stage runs it, so it lives beside its
tests (tests/report/test_layout*.py) rather than in the `ltm` package, and runs from the
repository root.
"""
from __future__ import annotations

import argparse
import base64
import html
import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.report.layout_html import (Node, classes, css_rules, lengths, matches, parse,
                                      selector_part_matches)
from tests.report.layout_text import line_height, text_lines, text_width

WINDOW = 1440  # the window the page's targets are set for
SCREEN = 900  # the first screen: the headline box must end within it
MAX_HEIGHT = 12_000
MIN_TEXT_PX = 9.0
# Legibility. A figure is a PNG drawn at `dpi`; the browser shows one image pixel per CSS pixel,
# shrunk to the column when wider (scale = shown width / own width). Text of f points is f * dpi
# / 72 image pixels, so f * dpi / 72 * scale on screen. "Unreadable": 10-pt text (matplotlib's
# default size; the figures' tick and axis labels are never smaller, 11 pt under the report's
# seaborn theme) under MIN_TEXT_PX, i.e. shrunk by more than dpi * 10 / 72 / 9 (1.70x at 110
# dpi): then none of the figure's text can be read. "Small text": the same for the 7 pt of the
# legends and annotations of ltm/report/figures.py, the smallest it draws (1.19x at 110 dpi).
DEFAULT_FONT_PT = 10.0
SMALLEST_FONT_PT = 7.0
BASE_FONT_PX = 16.0


def png_size(src: str) -> tuple[int, int, float | None]:
    """Width, height and dpi (None where the PNG does not say) of a base64 data-URI PNG."""
    data = base64.b64decode(src.split(",", 1)[1])
    width, height = struct.unpack(">II", data[16:24])
    at = data.find(b"pHYs", 0, 4096)
    dpi = None
    if at > 0:
        per_x, _, unit = struct.unpack(">IIB", data[at + 4:at + 13])
        dpi = per_x * 0.0254 if unit == 1 else None  # unit 1: pixels per metre
    return width, height, dpi


def content_width(style: str, window: int = WINDOW) -> float:
    """The body's width in a `window`-px window: the window less the body's side margins (8px
    each by default, `auto` none), at most its CSS max-width."""
    declared = {k: v for selector, d in css_rules(style) if selector == "body"
                for k, v in d.items()}
    margin = lengths(declared.get("margin"), BASE_FONT_PX) or [8.0]
    side = margin[1] if len(margin) > 1 else margin[0]
    widest = (lengths(declared.get("max-width"), BASE_FONT_PX) or [float(window)])[0]
    return min(widest, window - 2 * side)


@dataclass
class Element:
    """A top-level piece of the page: its estimated height, its own width and the width it is
    shown at (an image shrunk to the page, a table scrolling inside its box)."""
    kind: str
    top: float
    height: float
    width: float
    shown_width: float
    label: str = ""
    hidden_height: float = 0.0  # the content of a closed <details>


@dataclass
class FigureSize:
    index: int
    width: int
    height: int
    dpi: float
    shown_width: float

    @property
    def scale(self) -> float:
        return min(1.0, self.shown_width / self.width)

    def text_px(self, font_pt: float) -> float:
        """Size on screen of text drawn at `font_pt` points in this figure."""
        return font_pt * self.dpi / 72 * self.scale


@dataclass
class Layout:
    window: int
    content_width: float
    height: float
    elements: list[Element]
    figures: list[FigureSize]

    def widest(self) -> Element:
        return max(self.elements, key=lambda e: (e.shown_width, e.width))

    def headline(self) -> Element | None:
        return next((e for e in self.elements if e.kind == "headline"), None)

    def unreadable(self, font_pt: float = DEFAULT_FONT_PT) -> list[FigureSize]:
        return [f for f in self.figures if f.text_px(font_pt) < MIN_TEXT_PX]

    def overflow(self) -> float:
        """How far the widest shown element reaches beyond the window (0: no sideways scroll)."""
        return max(0.0, max((e.shown_width for e in self.elements), default=0.0)
                   - self.window + (self.window - self.content_width) / 2)


# the default stylesheet's vertical margins (em of the element's own font) and font scale
DEFAULTS = {"h1": (0.67, 2.0), "h2": (0.83, 1.5), "h3": (1.0, 1.17), "h4": (1.33, 1.0),
            "p": (1.0, 1.0), "ul": (1.0, 1.0), "ol": (1.0, 1.0), "pre": (1.0, 1.0)}
INLINE = {"img", "a", "b", "i", "em", "strong", "code", "span", "small", "sub", "sup", "br"}


def _table(node: Node, width: float, font: float) -> tuple[float, float]:
    """Height and width of a table in auto layout in a box `width` wide, its cells padded 2px 8px
    and at most 24em wide (the report's CSS)."""
    rows = [[(cell.text(), cell.tag == "th") for cell in tr.children
             if isinstance(cell, Node) and cell.tag in ("td", "th")] for tr in node.find("tr")]
    columns = max((len(r) for r in rows), default=0)
    cap, pad = 24 * font, 16.0
    natural, least = [pad] * columns, [pad] * columns
    for row in rows:
        for i, (text, bold) in enumerate(row):
            natural[i] = max(natural[i], min(cap, text_width(text, font, bold)) + pad)
            longest = max((text_width(w, font, bold) for w in text.split()), default=0.0)
            least[i] = max(least[i], min(cap, longest) + pad)
    if sum(natural) <= width:
        widths = natural
    elif sum(least) >= width:
        widths = least
    else:  # each column gets its minimum, the rest shared by how much more each one wants
        spare, wanted = width - sum(least), sum(natural) - sum(least)
        widths = [lo + spare * (hi - lo) / wanted for lo, hi in zip(least, natural)]
    height = 0.0
    for row in rows:
        lines = max((text_lines(text, widths[i] - pad, font, bold)
                     for i, (text, bold) in enumerate(row)), default=1)
        height += lines * line_height(font) + 4 + 1  # the cells' padding and bottom border
    return height, sum(widths)


@dataclass
class _Box:
    margin_top: float
    height: float  # between the margins
    margin_bottom: float
    width: float  # its content's own width
    shown_width: float  # what the page shows of it (shrunk image, scrolled table)
    hidden: float = 0.0


class _Layouter:
    def __init__(self, style: str, default_dpi: float) -> None:
        self.rules = css_rules(style)
        self.default_dpi = default_dpi
        self.figures: list[FigureSize] = []
        # `img{max-width:100%}`: a figure wider than the column is shown at the column's width
        img = Node("img", {})
        self.images_fit = any(selector_part_matches(s.split()[-1], img)
                              and d.get("max-width") == "100%" for s, d in self.rules if s.split())

    def style(self, node: Node, ancestors: list[Node]) -> dict[str, str]:
        merged: dict[str, str] = {}
        for selector, declared in self.rules:
            if matches(selector, node, ancestors):
                merged.update(declared)
        return merged

    def inline(self, nodes: list[Node | str], width: float, font: float) -> _Box:
        """Consecutive inline content (text, images) packed into lines."""
        text = " ".join(n if isinstance(n, str) else n.text() for n in nodes
                        if isinstance(n, str) or n.tag != "img").strip()
        height = text_lines(text, width, font) * line_height(font) if text else 0.0
        own, shown, line_w, line_h = 0.0, 0.0, 0.0, 0.0
        for node in (n for n in nodes if isinstance(n, Node) and n.tag == "img"):
            src = node.attrs.get("src", "")
            w, h, dpi = png_size(src) if src.startswith("data:image/png") else (0, 0, None)
            on_page = min(w, width) if self.images_fit else w
            self.figures.append(FigureSize(len(self.figures) + 1, w, h, dpi or self.default_dpi,
                                           on_page))
            if line_w and line_w + on_page > width:  # no room left: the image starts a line
                height, line_w, line_h = height + line_h, 0.0, 0.0
            line_w += on_page
            line_h = max(line_h, h * on_page / w if w else 0.0, line_height(font))
            own, shown = max(own, w), max(shown, on_page)
        if line_h:  # an image sits on the baseline, the font's descent below it
            height += line_h + round(0.212 * font)
        return _Box(0.0, height, 0.0, max(own, width if text else 0.0),
                    max(shown, width if text else 0.0))

    def flow(self, children: list[Node | str], width: float, font: float,
             ancestors: list[Node], record: list[Element] | None = None) -> _Box:
        """Children one under the other, adjacent margins collapsed; the first's top and the
        last's bottom margin are returned for the parent to collapse with its own."""
        boxes: list[tuple[Node | None, _Box]] = []
        run: list[Node | str] = []
        for child in [*children, None]:
            if child is not None and (isinstance(child, str) or child.tag in INLINE):
                run.append(child)
                continue
            if any(not isinstance(n, str) or n.strip() for n in run):
                boxes.append((None, self.inline(run, width, font)))
            run = []
            if child is not None and child.tag not in ("script", "style"):
                boxes.append((child, self.block(child, width, font, ancestors)))
        if not boxes:
            return _Box(0.0, 0.0, 0.0, 0.0, 0.0)
        y, previous_bottom = 0.0, None
        for node, box in boxes:
            if previous_bottom is not None:
                y += max(previous_bottom, box.margin_top)
            if record is not None:
                record.append(_element(node, y, box))
            y += box.height
            previous_bottom = box.margin_bottom
        return _Box(boxes[0][1].margin_top, y, boxes[-1][1].margin_bottom,
                    max(b.width for _, b in boxes), max(b.shown_width for _, b in boxes),
                    sum(b.hidden for _, b in boxes))

    def block(self, node: Node, width: float, font: float, ancestors: list[Node]) -> _Box:
        declared = self.style(node, ancestors)
        margin_em, scale = DEFAULTS.get(node.tag, (0.0, 1.0))
        size = lengths(declared.get("font-size"), font)
        font = size[0] if size else font * scale
        margin = lengths(declared.get("margin"), font) or [margin_em * font]
        padding = lengths(declared.get("padding"), font) or [0.0]
        border = (lengths(declared.get("border"), font) or [0.0])[0]
        pad_v, pad_h = padding[0], padding[1] if len(padding) > 1 else padding[0]
        inner = width - 2 * (pad_h + border) - (40.0 if node.tag in ("ul", "ol") else 0.0)
        inside = [*ancestors, node]
        if node.tag == "table":
            height, own = _table(node, inner, font)
            return _Box(margin[0], height, margin[0], own, own)
        if node.tag == "details":
            summary = [c for c in node.children if isinstance(c, Node) and c.tag == "summary"]
            rest = [c for c in node.children if not (isinstance(c, Node) and c.tag == "summary")]
            shut = self.flow(summary, inner, font, inside)
            body = self.flow(rest, inner, font, inside)
            if "open" in node.attrs:
                return _Box(0.0, shut.height + body.height, 0.0, body.width, body.shown_width)
            return _Box(0.0, shut.height, 0.0, shut.width, shut.shown_width, body.height)
        if declared.get("display") == "flex":
            return self.flex_row(node, inner, font, inside, declared, margin[0])
        columns = int(declared.get("columns", "1").split()[0] or 1)
        content = self.flow(node.children, inner, font, inside)
        height = content.height / columns
        closed = bool(pad_v or border or "overflow" in " ".join(declared) or columns > 1)
        if closed:  # padding, a border or its own formatting context keeps the margins inside
            height += content.margin_top + content.margin_bottom + 2 * (pad_v + border)
            top, bottom = margin[0], margin[0]
        else:
            top, bottom = max(margin[0], content.margin_top), max(margin[0], content.margin_bottom)
        shown = content.shown_width
        if any(k.startswith("overflow") and v in ("auto", "scroll") for k, v in declared.items()):
            shown = min(shown, inner)  # a wide child scrolls inside this box
        return _Box(top, height, bottom, content.width, shown, content.hidden)


    def flex_row(self, node: Node, width: float, font: float, ancestors: list[Node],
                 declared: dict, margin: float) -> _Box:
        """A wrapping flex row (the report's rows of figures and of tables): each item at its own
        width (an image blockified, without a line's descent), packed into lines with the gaps."""
        gaps = lengths(declared.get("gap"), font) or [0.0]
        row_gap, column_gap = gaps[0], gaps[-1]
        lines, line_w, line_h, own = [], 0.0, 0.0, 0.0
        for child in node.children:
            if isinstance(child, str):
                continue
            if child.tag == "img":
                self.inline([child], width, font)
                figure = self.figures[-1]
                item_w = figure.shown_width
                item_h = figure.height * item_w / figure.width if figure.width else 0.0
                own = max(own, figure.width)
            else:
                box = self.block(child, width, font, [*ancestors, node])
                item_w, item_h = min(box.shown_width, width), box.height + box.margin_top + box.margin_bottom
                own = max(own, box.width)
            if line_w and line_w + column_gap + item_w > width:
                lines.append(line_h)
                line_w, line_h = 0.0, 0.0
            line_w += (column_gap if line_w else 0.0) + item_w
            line_h = max(line_h, item_h)
        if line_w:
            lines.append(line_h)
        height = sum(lines) + row_gap * max(0, len(lines) - 1)
        return _Box(margin, height, margin, max(own, width), width)


def _element(node: Node | None, top: float, box: _Box) -> Element:
    if node is None:
        kind = "figure" if box.height and box.width else "text"
    elif node.tag == "details":
        kind = "folded"
    elif "headline" in classes(node):
        kind = "headline"
    elif node.find("table") or node.tag == "table":
        kind = "table"
    else:
        kind = node.tag
    label = "" if node is None else node.text()[:60]
    return Element(kind, top, box.height, box.width, box.shown_width, label, box.hidden)


def estimate(page: str, window: int = WINDOW, default_dpi: float = 110.0) -> Layout:
    """The page laid out in a `window`-px-wide browser window, estimated from its HTML."""
    body, style = parse(page)
    width = content_width(style, window)
    layouter = _Layouter(style, default_dpi)
    declared = layouter.style(body, [])
    margin = (lengths(declared.get("margin"), BASE_FONT_PX) or [8.0])[0]
    elements: list[Element] = []
    content = layouter.flow(body.children, width, BASE_FONT_PX, [body], elements)
    top = max(margin, content.margin_top)
    for element in elements:
        element.top += top
    height = top + content.height + max(margin, content.margin_bottom)
    return Layout(window, width, height, elements, layouter.figures)


BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# run in the page once it and its images have loaded: the numbers land in an attribute of <html>
_PROBE = """<script>window.addEventListener("load", function () {
  var root = document.documentElement, box = document.querySelector(".headline");
  var rect = box ? box.getBoundingClientRect() : null;
  var tops = Array.from(document.body.children)
    .filter(function (e) { return e.tagName != "SCRIPT"; })
    .map(function (e) {
      var r = e.getBoundingClientRect();
      return [e.tagName, r.top + scrollY, r.height, e.scrollWidth]; });
  root.setAttribute("data-layout", JSON.stringify({
    height: root.scrollHeight, width: root.scrollWidth, client_width: root.clientWidth,
    headline: rect && [rect.top + scrollY, rect.bottom + scrollY], elements: tops}));
});</script>"""


def browser() -> str | None:
    """A Chromium-family browser on PATH, or None."""
    return next((found for name in BROWSERS if (found := shutil.which(name))), None)


def measure_in_chromium(page: str, window: int = WINDOW, screen: int = SCREEN,
                        timeout: float = 60.0) -> dict | None:
    """The page's height and width, the headline box's top and bottom and each top-level
    element's top and height as headless Chromium lays it out in a `window` x `screen` window
    (scroll bars hidden, as on an overlay-scrollbar desktop); None without a browser."""
    command = browser()
    if command is None:
        return None
    probed = page.replace("</body>", _PROBE + "</body>") if "</body>" in page else page + _PROBE
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "page.html"
        path.write_text(probed)
        # --no-sandbox: the sandbox cannot start as root (containers); the page is our own file
        done = subprocess.run(
            [command, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--window-size={window},{screen}", "--virtual-time-budget=10000",
             f"--user-data-dir={folder}/profile", "--dump-dom", path.as_uri()],
            capture_output=True, text=True, timeout=timeout)
    found = re.search(r'data-layout="([^"]*)"', done.stdout)
    if not found:
        raise RuntimeError(f"{command} gave no measurement: {done.stderr.strip()[-300:]}")
    return json.loads(html.unescape(found.group(1)))


def summary_lines(page: str, window: int = WINDOW, in_browser: bool = True) -> list[str]:
    """The measurements, one line each: the estimate, then the browser's where there is one."""
    layout = estimate(page, window)
    widest, box = layout.widest(), layout.headline()
    hidden = sum(e.hidden_height for e in layout.elements)
    first_h2 = next((e.top for e in layout.elements if e.kind == "h2"), float("inf"))
    lines = [
        f"estimated height: {layout.height:,.0f} px at a {window}-px window "
        f"(target: at most {MAX_HEIGHT:,}; {hidden:,.0f} px more folded away)",
        f"widest element: {widest.kind} {widest.width:,.0f} px, shown at "
        f"{widest.shown_width:,.0f} px in a {layout.content_width:,.0f}-px column; "
        f"sideways overflow {layout.overflow():,.0f} px",
        "headline: none" if box is None else
        f"headline: {box.top:,.0f}-{box.top + box.height:,.0f} px "
        f"({'within' if box.top + box.height <= SCREEN else 'beyond'} the first {SCREEN} px, "
        f"{'before' if box.top < first_h2 else 'after'} the first section)"]
    for font_pt, word in ((DEFAULT_FONT_PT, "unreadable"), (SMALLEST_FONT_PT, "small text")):
        bad = layout.unreadable(font_pt)
        lines.append(f"figures {word} ({font_pt:g}-pt text under {MIN_TEXT_PX:g} px): "
                     f"{len(bad)} of {len(layout.figures)}"
                     + "".join(f"; #{f.index} {f.width}->{f.shown_width:.0f} px at {f.dpi:.0f} dpi"
                               f" ({f.text_px(font_pt):.1f} px)" for f in bad))
    measured = measure_in_chromium(page, window) if in_browser else None
    if measured is None:
        lines.append("measured: no Chromium-family browser on PATH" if in_browser
                     else "measured: not asked")
    else:
        sideways = measured["width"] - measured["client_width"]
        lines.append(f"measured in {Path(browser() or '').name}: {measured['height']:,} px tall, "
                     f"{measured['width']:,} px wide ({sideways:,} px sideways scroll), headline "
                     + ("none" if not measured["headline"] else
                        f"{measured['headline'][0]:,.0f}-{measured['headline'][1]:,.0f} px"))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The report page's height, width, headline and "
                                                 "figure legibility at a browser window's width.")
    parser.add_argument("page", nargs="?", default="reports/report.html")
    parser.add_argument("--window", type=int, default=WINDOW, help="window width in px")
    parser.add_argument("--no-browser", action="store_true", help="the estimate only")
    args = parser.parse_args(argv)
    if not Path(args.page).is_file():
        print(f"ltm: {args.page}: no such page (dvc repro report builds it)", file=sys.stderr)
        return 2
    for line in summary_lines(Path(args.page).read_text(), args.window, not args.no_browser):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
