"""The README's processor runs as printed: its block is executed and prints what the README says."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_processor_prints_what_the_readme_says() -> None:
    text = README.read_text()
    section = text[text.index("## A processor") :]
    block = re.search(r"^```python\n(.*?)^```\n", section, re.M | re.S)
    assert block is not None
    printed = re.search(r"^It prints `(.+?)`", section, re.M)
    assert printed is not None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.group(1), str(README), "exec"), {"__name__": "readme"})  # noqa: S102
    assert out.getvalue().strip() == printed.group(1)
