"""The report page's HTML as tests.report.layout needs it: a tree of elements, its CSS rules and
which rule applies to which element. Only what the report uses: tags, classes, one-level
selectors joined by spaces, lengths in em or px. Part of that test instrument, not of the `ltm`
package."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = {"img", "meta", "br", "hr", "input", "link", "source", "wbr"}
# a block that starts inside an open <p> closes it first, as a browser's parser does
CLOSES_P = {"p", "div", "ul", "ol", "table", "details", "nav", "pre", "h1", "h2", "h3", "h4"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node | str] = field(default_factory=list)

    def text(self) -> str:
        return " ".join(" ".join(c.split()) if isinstance(c, str) else c.text()
                        for c in self.children).strip()

    def find(self, tag: str) -> list[Node]:
        found = []
        for child in self.children:
            if isinstance(child, Node):
                found += ([child] if child.tag == tag else []) + child.find(tag)
        return found


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        if tag in CLOSES_P and self.stack[-1].tag == "p":
            self.stack.pop()
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_endtag(self, tag: str) -> None:
        # close up to the matching open tag (the report's HTML is well formed; this tolerates <p>)
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse(page: str) -> tuple[Node, str]:
    """The page's <body> as a tree, and its CSS."""
    builder = _TreeBuilder()
    builder.feed(page)
    body = (builder.root.find("body") or [builder.root])[0]
    style = " ".join(node.text() for node in builder.root.find("style"))
    return body, style


def css_rules(style: str) -> list[tuple[str, dict[str, str]]]:
    """The page's CSS as (simple selector, declarations), in source order."""
    rules = []
    for selectors, body in re.findall(r"([^{}]+)\{([^}]*)\}", style):
        declared = {k.strip(): v.strip() for k, _, v in
                    (item.partition(":") for item in body.split(";")) if v.strip()}
        rules += [(selector.strip(), declared) for selector in selectors.split(",")]
    return rules


def classes(node: Node) -> set[str]:
    return set(node.attrs.get("class", "").split())


def selector_part_matches(part: str, node: Node) -> bool:
    tag, _, cls = part.partition(".")
    return (not tag or tag == node.tag) and (not cls or cls in classes(node))


def matches(selector: str, node: Node, ancestors: list[Node]) -> bool:
    """A selector of tags and classes joined by spaces (all this page uses)."""
    parts = selector.split()
    if not parts or not selector_part_matches(parts[-1], node):
        return False
    at = len(ancestors) - 1
    for part in reversed(parts[:-1]):
        while at >= 0 and not selector_part_matches(part, ancestors[at]):
            at -= 1
        if at < 0:
            return False
        at -= 1
    return True


def lengths(value: str | None, font: float) -> list[float]:
    """A CSS length list (`0.2em 1em`, `2px solid #000`) in px, em and rem taken as `font` (the
    report sets no font size on its root); `auto` counts 0, other words are left out."""
    out = []
    for item in (value or "").split():
        number = re.match(r"^(-?[\d.]+)(em|px)?$", item)
        if number:
            unit = number.group(2) or "px"
            out.append(float(number.group(1)) * (font if unit.endswith("em") else 1.0))
        elif item == "auto":
            out.append(0.0)
    return out
