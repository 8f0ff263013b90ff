"""Every Python example of the README and docs/ is run by a test, as its fence says.

The words of a ```` ```python ```` fence (tests/support/doc_blocks.py, docs/testing.md) say
how: none, a complete example run here as a script; ``excerpt=<path>``, checked line by line
against that module; ``file=`` / ``append=``, the guide's package, whose tests are run here
(and the guide's ``file=`` / ``run`` blocks by tests/spark/test_guide.py); ``stack``, run
against what a running stack holds (its broker and Redis, its HTTP API, an archive) by
tests/integration/test_docs_stack_examples.py. Every block
also parses and imports only refold's public API (or one of refold's example processors).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import refold
from tests.spark.test_guide import parse_guide
from tests.support.doc_blocks import (
    GUIDE,
    PAGES,
    ROOT,
    DocBlock,
    assemble_guide_package,
    code_lines,
    python_blocks,
)

# refold's own processors, as registered: refold.processors.<name>
EXAMPLE_PACKAGES = {
    ep.value.split(":")[0].rpartition(".")[0]
    for ep in entry_points(group="refold.processors")
    if ep.value.startswith("refold.processors.")
}
KINDS = ("excerpt", "file", "append", "run", "stack")
# A complete example is a few lines of pure Python; the import of refold is most of it.
RUN_TIMEOUT_S = 120
BLOCKS = python_blocks()


def _kind(block: DocBlock) -> str:
    return next((k for k in KINDS for w in block.words if w.split("=")[0] == k), "complete")


def _of(kind: str) -> list[DocBlock]:
    return [b for b in BLOCKS if _kind(b) == kind]


def _env(*paths: Path) -> dict[str, str]:
    """``paths``, then this checkout's refold (the venv may hold another editable install) on
    the path; no ``REFOLD_*`` variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REFOLD_")}
    return {**env, "PYTHONPATH": os.pathsep.join(str(p) for p in (*paths, ROOT))}


def _internal_reference(node: ast.AST) -> list[str]:
    """A ``"module:Name"`` string (``ProcessorSpec(options=...)``, ``projection=...``) that
    names a public name through refold's internal module: ``"refold:Name"`` says it."""
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return []
    module, colon, name = node.value.partition(":")
    if not (colon and module.startswith("refold.") and name in refold.__all__):
        return []
    return [f"{node.value!r} names the internal {module}: write 'refold:{name}'"]


def _problems(page: Path) -> list[str]:
    found = []
    for block in (b for b in BLOCKS if b.page == page):
        line = block.line
        try:
            tree = ast.parse(block.text)
        except SyntaxError as exc:
            found.append(f"line {line}: {exc}")
            continue
        for node in ast.walk(tree):
            found += [f"line {line}: {p}" for p in _internal_reference(node)]
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


# Shapes the docs show a method returning, which no user builds.
_RETURNED_ONLY = {"Watermark"}


def _refold_classes() -> set[str]:
    """The public-looking classes refold's source defines (top level, no leading ``_``),
    refold's example processors' own aside (the docs may import those)."""
    found = set()
    for folder in ("contracts", "processors", "services", "replay", "deploy"):
        for path in (ROOT / folder).rglob("*.py"):
            module = "refold." + ".".join(path.relative_to(ROOT).with_suffix("").parts)
            if any(module.startswith(f"{p}.") for p in EXAMPLE_PACKAGES):
                continue
            tree = ast.parse(path.read_text())
            found |= {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    return {name for name in found if not name.startswith("_")}


def test_every_refold_class_the_docs_text_calls_is_public() -> None:
    """A call written in the text (``resolver=KeyResolver(...)``), outside code blocks, is
    an example too: the user writes ``from refold import KeyResolver`` next."""
    classes = _refold_classes() - set(refold.__all__) - _RETURNED_ONLY
    problems = []
    for page in PAGES:
        text = page.read_text()
        # fenced blocks blanked (the test above reads them), line numbers kept
        text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
        for span in re.finditer(r"`([^`]+)`", text):
            for name in re.findall(r"\b([A-Z][A-Za-z0-9]+)\(", span.group(1)):
                if name in classes:
                    line = text[: span.start()].count("\n") + 1
                    problems.append(f"{page.relative_to(ROOT)}:{line}: {name} is not public")
    assert problems == []


def test_every_python_example_says_one_way_it_is_run() -> None:
    problems = []
    for block in BLOCKS:
        kinds = {w.split("=")[0] for w in block.words}
        if not kinds <= set(KINDS) or len(kinds) > 1:
            problems.append(f"{block.where}: {block.words} is not one of {KINDS} (or none)")
        for word in block.words:
            if word.split("=")[0] in ("file", "append", "excerpt") and not word.partition("=")[2]:
                problems.append(f"{block.where}: {word} needs a path")
        if kinds & {"run"} and block.page != GUIDE:
            problems.append(f"{block.where}: only the guide's blocks are run by test_guide")
    assert problems == []


def test_the_guide_s_test_sees_every_file_and_run_block_of_the_guide() -> None:
    marked = {b.line for b in BLOCKS if b.page == GUIDE and _kind(b) in ("file", "run")}
    seen = {b.line for b in parse_guide(GUIDE.read_text()) if b.lang == "python"}
    assert marked == seen


@pytest.mark.parametrize("block", _of("complete"), ids=lambda b: b.where)
def test_a_complete_example_runs(block: DocBlock, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", block.text],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, f"{block.where}:\n{block.text}\n{result.stderr[-3000:]}"


@pytest.mark.parametrize("block", _of("excerpt"), ids=lambda b: b.where)
def test_an_excerpt_is_the_code_of_its_module(block: DocBlock) -> None:
    source = block.value("excerpt")
    assert source is not None
    module = code_lines((ROOT / source).read_text())
    position = 0
    for line in code_lines(block.text):
        try:
            position = module.index(line, position) + 1
        except ValueError:
            pytest.fail(f"{block.where}: {line!r} is not in {source} (after line {position})")


def test_the_guide_package_s_tests_pass(tmp_path: Path) -> None:
    written = assemble_guide_package(tmp_path)
    tests = sorted(str(p.relative_to(tmp_path)) for p in written if p.parts[-2] == "tests")
    assert len(tests) >= 4, tests
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
