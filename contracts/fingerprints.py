"""Fingerprints recorded with each generation: which code and which schemas built it."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Iterable

from contracts.catalog import SchemaCatalog

__all__ = ["code_fingerprint", "schema_fingerprints"]


def code_fingerprint(*objects: object) -> str:
    """SHA-256 (first 16 hex digits) of the source of the given modules, classes or functions."""
    digest = hashlib.sha256()
    for obj in objects:
        target = obj if inspect.ismodule(obj) else inspect.getmodule(obj) or obj
        digest.update(inspect.getsource(target).encode())  # type: ignore[arg-type]
    return digest.hexdigest()[:16]


def schema_fingerprints(catalog: SchemaCatalog, event_types: Iterable[str]) -> dict[str, str]:
    """Reader schema fingerprint (hex) per event type."""
    return {name: catalog.latest(name).fingerprint_hex for name in sorted(event_types)}
