"""The README, the docs pages and params.yaml's comments name only files that exist: every
relative link, and every source path written in backticks (README, docs) or in a comment
(params.yaml). Generated outputs (reports/, data/) and patterns (<stage>, {a,b}, *) are not
checked."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCE_DIRS = ("ltm/", "kernels/", "notebooks/", "gpu/", "tests/", "configs/", "docs/", "records/")
PATH = re.compile(r"(?<![\w./-])((?:%s)[\w./-]*\w)" % "|".join(re.escape(d) for d in SOURCE_DIRS))


def named_paths(text: str) -> set[str]:
    """Source paths named in a text: in backticks or markdown links, or bare in a comment."""
    found = set()
    for match in PATH.finditer(text):
        path = match.group(1).rstrip(".")
        after = text[match.end():match.end() + 2]
        if after[:1] in tuple("<{*$[") or after in ("-*", "-<", ".*"):
            continue  # a pattern, not a path
        found.add(path)
    return found


def missing(paths: set[str]) -> list[str]:
    out = []
    for path in sorted(paths):
        # `ltm.kernels` is the kernels/ folder; python -m module paths name modules, not files
        candidates = [ROOT / path, ROOT / (path + ".py")]
        if path.startswith("ltm/kernels"):
            candidates.append(ROOT / path.replace("ltm/kernels", "kernels", 1))
        if not any(c.exists() for c in candidates):
            out.append(path)
    return out


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_link_and_source_path_of_a_page_exists(page):
    text = page.read_text()
    links = {m.group(1).split("#")[0] for m in re.finditer(r"\]\(([^)]+)\)", text)
             if not re.match(r"https?:|#|mailto:", m.group(1))}
    broken = [link for link in sorted(links) if link and not (page.parent / link).resolve().exists()]
    assert not broken, f"{page.name}: links to nothing: {broken}"
    assert not missing(named_paths(text)), f"{page.name}: names missing files: {missing(named_paths(text))}"


def test_params_comments_name_only_existing_files():
    comments = "\n".join(line.split("#", 1)[1] for line in (ROOT / "params.yaml").read_text().splitlines()
                         if "#" in line)
    assert not missing(named_paths(comments)), missing(named_paths(comments))


def test_the_path_check_finds_a_missing_file():
    assert missing(named_paths("see `ltm/no_such_module.py` and ltm/params.py")) == ["ltm/no_such_module.py"]
    assert named_paths("`reports/metrics/<stage>.json` and ltm/{a,b}.py") == set()
