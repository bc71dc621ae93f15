"""tests.report.layout_html: the page as a tree, its CSS and which rule applies where."""
from tests.report.layout_html import classes, css_rules, lengths, matches, parse

PAGE = ("<html><head><style>body{max-width:900px}.box li{margin:0.3em 0}</style></head><body>"
        "<h1>T</h1><div class=box><ul><li>one <b>bold</b></li><li>two</li></ul></div>"
        "<img src=x><p>a<p>b</body></html>")


def test_the_body_is_a_tree_with_text():
    body, style = parse(PAGE)
    assert [c.tag for c in body.children] == ["h1", "div", "img", "p", "p"]
    assert body.children[1].find("li")[0].text() == "one bold"
    assert classes(body.children[1]) == {"box"} and "max-width:900px" in style


def test_rules_apply_by_tag_class_and_ancestor():
    body, style = parse(PAGE)
    rules = dict(css_rules(style))
    assert rules[".box li"] == {"margin": "0.3em 0"}
    box = body.children[1]
    li = box.find("li")[0]
    assert matches(".box li", li, [body, box, box.children[0]])
    assert not matches(".box li", li, [body])
    assert matches("body", body, []) and not matches("p", body, [])


def test_lengths_in_px():
    assert lengths("0.2em 1em", 10) == [2.0, 10.0]
    assert lengths("2px solid #1f77b4", 10) == [2.0]
    assert lengths("2em auto", 16) == [32.0, 0.0]
    assert lengths(None, 16) == []
