"""MkDocs hook: show the docs' marked code blocks as plain code blocks.

A fence's words after the language say how a test runs the block
(```` ```python file=pkg/mod.py ````, ```` ```bash run ````, ```` ```python excerpt=path ````,
```` ```python stack ````; docs/testing.md, "Examples in the docs"). Markdown's fenced-code
syntax takes only a language there, so the words are dropped from the rendered page.
"""

from __future__ import annotations

import re
from typing import Any

_MARKED = re.compile(r"^```(?P<lang>[\w+-]+)[ \t]+(?P<marks>[^\n`{]+)$", re.M)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Rewrite ```` ```lang marks ```` to ```` ```lang ```` (pymdownx-free, title-less)."""
    return _MARKED.sub(lambda m: f"```{m['lang']}", markdown)
