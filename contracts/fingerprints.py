"""Fingerprints recorded with each generation: which code and which schemas built it."""

from __future__ import annotations

import ast
import hashlib
import inspect
from collections.abc import Iterable

from contracts.catalog import SchemaCatalog

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


def code_fingerprint(*parts: object) -> str:
    """SHA-256 (first 16 hex digits) of what code does, and of version markers.

    Modules count with their source, classes and functions with their module's source, plain
    strings as they are. Sources are hashed as syntax trees without import lines, docstrings,
    comments and formatting: moving an import or a module (refactoring) keeps the fingerprint,
    changing a statement or a constant changes it.
    """
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, str):
            digest.update(part.encode())
            continue
        target = part if inspect.ismodule(part) else inspect.getmodule(part) or part
        digest.update(_normalised(inspect.getsource(target)).encode())  # type: ignore[arg-type]
    return digest.hexdigest()[:16]


def schema_fingerprints(catalog: SchemaCatalog, event_types: Iterable[str]) -> dict[str, str]:
    """Reader schema fingerprint (hex) per event type."""
    return {name: catalog.latest(name).fingerprint_hex for name in sorted(event_types)}
