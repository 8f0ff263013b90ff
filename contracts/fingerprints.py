"""Fingerprints recorded with each generation: which code and which schemas built it."""

from __future__ import annotations

import ast
import contextlib
import hashlib
import inspect
import weakref
from collections.abc import Iterable

from refold.contracts.catalog import SchemaCatalog

__all__ = ["code_fingerprint", "schema_fingerprints"]


class _WhatFolds(ast.NodeTransformer):
    """Drops what cannot change a fold's result: import lines and docstrings."""

    def visit_Import(self, node: ast.Import) -> None:
        return None

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        return None

    def generic_visit(self, node: ast.AST) -> ast.AST:
        node = super().generic_visit(node)
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
        return node


def _normalised(source: str) -> str:
    """The source's syntax tree without imports, docstrings, comments and layout."""
    tree = _WhatFolds().visit(ast.parse(source))
    return ast.dump(tree, annotate_fields=False)


# The normalised source of each module, class or function, read the first time this process
# fingerprints it. Keyed by the object itself (weakly): a reloaded module's new classes and
# functions are read again, the ones this process runs keep the source they were loaded from.
_LOADED_SOURCE: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()


def _source_as_loaded(part: object) -> str:
    """The normalised source of ``part``'s module, as it was when first fingerprinted here.

    ``inspect.getsource`` reads the file on disk *now* (linecache re-reads a changed file), so
    a process fingerprinting its code again after the file was edited would get the new code's
    fingerprint while running the old code: the one way a generation could be written by code
    it was not built with (a running processor following a cutover to a rebuild of new code).
    Reading once, as early as possible (refold fingerprints a processor right after importing
    it), pins the fingerprint to the code the process runs.
    """
    with contextlib.suppress(KeyError, TypeError):  # TypeError: takes no weak reference
        return _LOADED_SOURCE[part]
    target = part if inspect.ismodule(part) else inspect.getmodule(part) or part
    normalised = _normalised(inspect.getsource(target))  # type: ignore[arg-type]
    with contextlib.suppress(TypeError):
        _LOADED_SOURCE[part] = normalised
    return normalised


def code_fingerprint(*parts: object) -> str:
    """SHA-256 (first 16 hex digits) of what code does, and of version markers.

    Modules count with their source, classes and functions with their module's source, plain
    strings as they are. Sources are hashed as syntax trees without import lines, docstrings,
    comments and formatting: moving an import or a module (refactoring) keeps the fingerprint,
    changing a statement or a constant changes it.

    A process fingerprints the code it loaded: each object's source is read from disk the
    first time it is fingerprinted here, never again (see :func:`_source_as_loaded`).
    """
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, str):
            digest.update(part.encode())
            continue
        digest.update(_source_as_loaded(part).encode())
    return digest.hexdigest()[:16]


def schema_fingerprints(catalog: SchemaCatalog, event_types: Iterable[str]) -> dict[str, str]:
    """Reader schema fingerprint (hex) per event type."""
    return {name: catalog.latest(name).fingerprint_hex for name in sorted(event_types)}
