"""Every Python example of the README and docs/ parses, and imports only refold's public API.

The tutorial's blocks and the README's processor are run by their own tests
(tests/spark/test_guide.py, tests/unit/test_readme_example.py); the rest need a running stack,
so here they are held to what can be checked without one: valid Python, and ``refold`` names
that exist. An example may also import one of refold's own example processors (the demo's),
which are installed with refold.
"""

from __future__ import annotations

import ast
import re
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import refold

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.M | re.S)
# refold's own processors, as registered: refold.processors.<name>
EXAMPLE_PACKAGES = {
    ep.value.split(":")[0].rpartition(".")[0]
    for ep in entry_points(group="refold.processors")
    if ep.value.startswith("refold.processors.")
}


def _problems(page: Path) -> list[str]:
    text = page.read_text()
    found = []
    for match in _BLOCK.finditer(text):
        line = text[: match.start()].count("\n") + 1
        try:
            tree = ast.parse(match.group(1))
        except SyntaxError as exc:
            found.append(f"line {line}: {exc}")
            continue
        for node in ast.walk(tree):
            modules = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            for module in modules:
                if module == "refold" and isinstance(node, ast.ImportFrom):
                    found += [
                        f"line {line}: {a.name} is not public"
                        for a in node.names
                        if a.name not in refold.__all__
                    ]
                elif module.startswith("refold.") and not any(
                    module == p or module.startswith(f"{p}.") for p in EXAMPLE_PACKAGES
                ):
                    found.append(f"line {line}: imports the internal module {module}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_example_parses_and_imports_only_public_names(page: Path) -> None:
    assert _problems(page) == []
