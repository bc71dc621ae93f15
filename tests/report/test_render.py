"""ltm.report.render: the page's first screen, folded history, tables without index columns."""
import pandas as pd

from ltm.report.gpu import Section
from ltm.report.render import human, render_html


def test_the_page_leads_with_the_headline_then_contents_then_sections():
    sections = [Section("First one", [pd.DataFrame({"a": [1.23456789]})], [], "note"),
                Section("History", [pd.DataFrame({"b": [1]})], [], "", folded=True)]
    page = render_html("T", sections, {"commit": "abc"}, 80, ["line one", "line <two>"])
    assert page.index("class=headline") < page.index("<nav>") < page.index('<h2 id="first-one">')
    assert "line &lt;two&gt;" in page and '<a href="#history">History</a>' in page
    assert "<details><summary>show (0 figures, 1 tables)</summary>" in page
    assert page.index("<details>") > page.index('<h2 id="history">')
    assert "<th></th>" not in page and "1.235" in page and 'class=tw' in page


def test_numbers_are_formatted_for_people():
    assert human(1234567.8) == "1,234,568" and human(0.000123456) == "0.0001235"
    assert human(float("nan")) == "" and human(True) == "True" and human("x") == "x"
