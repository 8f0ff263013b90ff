"""The fenced code blocks of the README and docs/, and how each Python example is run.

The info string of a ```` ```python ```` fence says how its tests run it (docs/testing.md,
"Examples in the docs"):

- no word: a complete example, run as a script in an empty directory (it must exit 0);
- ``excerpt=<path>``: an abridged excerpt of a module of this repository: its code lines, in
  order, are lines of that file (blank lines, comments and ``...`` elisions aside);
- ``file=<path>`` / ``run``: the tutorial's project (tests/spark/test_guide.py writes and runs
  them); ``file=`` and ``append=<path>`` blocks of any page also build the guide's package
  (:func:`assemble_guide_package`), whose ``tests/`` are run by a unit test;
- ``stack``: reads what a running stack holds: its Redis and broker (``StackSettings()``:
  ``REFOLD_REDIS__URL`` and the others, with their defaults), its HTTP API (``REFOLD_URL``,
  ``REFOLD_KEY``) or its archive (``archive/`` in the working directory);
  tests/integration/test_docs_stack_examples.py runs it against the test session's broker and
  Redis, after giving it what it reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "GUIDE",
    "PAGES",
    "ROOT",
    "DocBlock",
    "assemble_guide_package",
    "code_lines",
    "doc_blocks",
    "python_blocks",
]

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "write-your-own-processor.md"
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
_FENCE = re.compile(r"^```(?P<lang>[A-Za-z0-9_+-]*)(?P<info>.*)$")


@dataclass(frozen=True, slots=True)
class DocBlock:
    """A fenced code block: its page, first line (the fence, 1-based), language, words, text."""

    page: Path
    line: int
    lang: str
    words: tuple[str, ...]
    text: str

    @property
    def where(self) -> str:
        """``page:line``, relative to the repository."""
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def value(self, name: str) -> str | None:
        """The value of the block's ``name=`` word, if it has one."""
        return next((w.split("=", 1)[1] for w in self.words if w.startswith(f"{name}=")), None)


def doc_blocks(page: Path) -> list[DocBlock]:
    """Every fenced block of ``page``, in order (fences of three backticks, as the docs use)."""
    lines = page.read_text().splitlines()
    blocks: list[DocBlock] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        i += 1
        words = tuple(match["info"].split())
        blocks.append(DocBlock(page, start + 1, match["lang"], words, "\n".join(body) + "\n"))
    return blocks


def python_blocks(pages: tuple[Path, ...] = PAGES) -> list[DocBlock]:
    """Every ```` ```python ```` block of the pages."""
    return [b for page in pages for b in doc_blocks(page) if b.lang == "python"]


_INLINE_COMMENT = re.compile(r"\s+#.*$")


def code_lines(text: str) -> list[str]:
    """The lines an excerpt is checked by: stripped, without blank lines, comments (whole-line
    or after two spaces, as ruff formats them) and ``...`` elisions."""
    out = []
    for raw in text.splitlines():
        line = _INLINE_COMMENT.sub("", raw).strip() if "  #" in raw else raw.strip()
        if line and not line.startswith("#") and line not in ("...", "...,"):
            out.append(line)
    return out


def assemble_guide_package(into: Path) -> list[Path]:
    """Write the guide's package under ``into``: every ``file=`` block of the guide, then of
    the other pages, then every ``append=`` block appended to its file (in page order, the
    guide first). A file given twice must be given the same text: the pages cannot disagree.

    Returns:
        The files written.
    """
    pages = (GUIDE, *(p for p in PAGES if p != GUIDE))
    blocks = [b for page in pages for b in doc_blocks(page) if "run" not in b.words]
    texts: dict[str, tuple[str, str]] = {}
    for block in blocks:
        path = block.value("file")
        if path is None:
            continue
        if path in texts and texts[path][1] != block.text:
            msg = f"{block.where} gives {path} another text than {texts[path][0]}"
            raise AssertionError(msg)
        texts[path] = (block.where, block.text)
    for path, (_where, text) in texts.items():
        (into / path).parent.mkdir(parents=True, exist_ok=True)
        (into / path).write_text(text)
    for block in blocks:
        path = block.value("append")
        if path is not None:
            with (into / path).open("a") as out:
                out.write(f"\n\n# {block.where}\n{block.text}")
    return [into / p for p in texts]
