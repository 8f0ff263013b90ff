"""Fingerprints recorded with each generation: which code and which schemas built it."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Iterable

from contracts.catalog import SchemaCatalog

__all__ = ["code_fingerprint", "schema_fingerprints"]


def code_fingerprint(*parts: object) -> str:
    """SHA-256 (first 16 hex digits) of source code and version markers.

    Modules count with their source, classes and functions with their module's source, plain
    strings as they are.
    """
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, str):
            digest.update(part.encode())
            continue
        target = part if inspect.ismodule(part) else inspect.getmodule(part) or part
        digest.update(inspect.getsource(target).encode())  # type: ignore[arg-type]
    return digest.hexdigest()[:16]


def schema_fingerprints(catalog: SchemaCatalog, event_types: Iterable[str]) -> dict[str, str]:
    """Reader schema fingerprint (hex) per event type."""
    return {name: catalog.latest(name).fingerprint_hex for name in sorted(event_types)}
