"""The docs hold together: docs/index.md links every page, and no relative link is broken.

Every relative link of the README and of docs/ must name a file of the repository, and an
``#anchor`` a heading of that file (GitHub's rule: lower case, punctuation dropped, spaces to
dashes). Links to other sites are not followed (no network here).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text())
    headings = re.findall(r"^#{1,6} (.+)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def _links(path: Path) -> list[str]:
    return _LINK.findall(_FENCE.sub("", path.read_text()))


def _resolves(page: Path, target: str) -> bool:
    if re.match(r"^[a-z]+:", target):  # http:, https:, mailto: are not followed
        return True
    path, _, anchor = target.partition("#")
    resolved = (page.parent / path).resolve() if path else page
    if not resolved.exists():
        return False
    return not anchor or resolved.suffix != ".md" or anchor in _anchors(resolved)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert [t for t in _links(page) if not _resolves(page, t)] == []


def test_the_index_links_every_page() -> None:
    linked = {(DOCS / t.partition("#")[0]).resolve() for t in _links(DOCS / "index.md")}
    pages = {p.resolve() for p in DOCS.glob("*.md") if p.name != "index.md"}
    assert sorted(p.name for p in pages - linked) == []
