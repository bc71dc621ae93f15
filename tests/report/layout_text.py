"""Text metrics for tests.report.layout: how wide a string is and how many lines it wraps into in
the browser's default sans-serif. Browsers map sans-serif to Arial or a font with its metrics
(Liberation Sans, Helvetica), so the Helvetica widths of the standard AFM files stand for all.
Part of that test instrument, not of the `ltm` package."""
from __future__ import annotations

import math
import re

# advance widths of the characters 32..126 in 1/1000 em, regular and bold (Helvetica AFM)
_REGULAR = [int(w) for w in """
278 278 355 556 556 889 667 222 333 333 389 584 278 333 278 278 556 556 556 556 556 556 556 556
556 556 278 278 584 584 584 556 1015 667 667 722 722 667 611 778 722 278 500 667 556 833 722 778
667 778 722 667 611 722 667 944 667 667 611 278 278 278 469 556 222 556 556 500 556 556 278 556
556 222 222 500 222 833 556 556 556 556 333 500 278 556 500 722 500 500 500 334 260 334 584
""".split()]
_BOLD = [int(w) for w in """
278 333 474 556 556 889 722 278 333 333 389 584 278 333 278 278 556 556 556 556 556 556 556 556
556 556 333 333 584 584 584 611 975 722 722 722 722 667 611 778 722 278 556 722 611 833 722 778
667 778 722 667 611 722 667 944 667 667 611 333 278 333 584 556 278 556 611 556 611 556 333 611
611 278 278 556 278 889 611 611 611 611 389 556 333 611 556 778 556 556 500 389 280 389 584
""".split()]
_OTHER = 556  # anything outside ASCII: a digit's width, the most common width of the font


def text_width(text: str, font_px: float, bold: bool = False) -> float:
    """Width in px of `text` on one line."""
    table = _BOLD if bold else _REGULAR
    return font_px / 1000 * sum(table[ord(c) - 32] if 32 <= ord(c) < 127 else _OTHER
                                for c in text)


def line_height(font_px: float) -> float:
    """The browser's `line-height: normal` for the font: its ascent, descent and line gap
    (0.905, 0.212 and 0.033 em), each rounded to whole pixels as Chromium does."""
    return float(round(0.905 * font_px) + round(0.212 * font_px) + round(0.033 * font_px))


def text_lines(text: str, width: float, font_px: float, bold: bool = False) -> int:
    """Lines `text` takes in a box `width` px wide, wrapped at spaces and after hyphens, as the
    browser does (a piece wider than the box breaks, as `overflow-wrap: break-word` lets it)."""
    if not text.strip():
        return 1
    space = text_width(" ", font_px, bold)
    width += 0.01  # a line exactly as wide as its box fits
    lines, used = 1, 0.0
    for word in text.split():
        for number, piece in enumerate(re.findall(r"[^-]*-+|[^-]+", word)):
            gap = space if used and number == 0 else 0.0
            w = text_width(piece, font_px, bold)
            if used and used + gap + w > width:
                lines, used, gap = lines + 1, 0.0, 0.0
            if w > width:  # broken over as many lines as it needs
                extra = math.ceil(w / width) - 1
                lines, w = lines + extra, w - extra * width
            used += gap + w
    return lines
