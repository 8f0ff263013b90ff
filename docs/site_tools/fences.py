"""MkDocs hook: show the guide's runnable blocks as plain code blocks.

The tutorial marks blocks for its test (```` ```python file=pkg/mod.py ```` or
```` ```bash run ````; tests/spark/test_guide.py writes or runs them). Markdown's fenced-code
syntax takes only a language there, so the marks are moved into the block's title.
"""

from __future__ import annotations

import re
from typing import Any

_MARKED = re.compile(r"^```(?P<lang>[\w+-]+)[ \t]+(?P<marks>[^\n`{]+)$", re.M)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Rewrite ```` ```lang marks ```` to ```` ```lang ```` (pymdownx-free, title-less)."""
    return _MARKED.sub(lambda m: f"```{m['lang']}", markdown)
