"""tests.report.layout_text: widths of the default sans-serif, line heights, line wrapping."""
from pytest import approx

from tests.report.layout_text import line_height, text_lines, text_width


def test_widths_are_arials():
    assert text_width("0123456789", 10) == approx(55.6)  # every digit 0.556 em
    assert text_width("Wi", 10) == approx(9.44 + 2.22)
    assert text_width("Wi", 10, bold=True) > text_width("Wi", 10)
    assert text_width("±", 10) == approx(5.56)  # outside ASCII: a digit's width


def test_line_heights_are_chromiums_for_the_sizes_the_page_uses():
    # measured: body text, table cells (0.85em), h2 (1.5em), h1 (2em)
    assert [line_height(px) for px in (16, 13.6, 24, 32)] == [18, 15, 28, 37]


def test_text_wraps_at_spaces_and_after_hyphens():
    word = text_width("abcd", 10)
    assert text_lines("abcd abcd", word * 2 + text_width(" ", 10), 10) == 1
    assert text_lines("abcd abcd", word * 2, 10) == 2
    assert text_lines("abcd-abcd", word + text_width("-", 10), 10) == 2
    assert text_lines("", 100, 10) == 1
    # a word wider than the box breaks over the lines it needs
    assert text_lines("x" * 30, text_width("x" * 10, 10), 10) == 3
