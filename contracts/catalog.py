"""The schema registry of refold: every Avro record version under ``contracts/schemas``.

Files are named ``<domain>/<RecordName>.v<N>.avsc``, one version per file, never deleted, so a
replay from the earliest offset finds the writer schema of every record ever produced.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

from refold.contracts.errors import ContractError, UnknownEventTypeError, UnknownSchemaError

__all__ = ["SCHEMA_ROOT", "SchemaCatalog", "SchemaVersion", "default_catalog"]

SCHEMA_ROOT = Path(__file__).parent / "schemas"
_FILE_NAME = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)\.v(?P<version>[0-9]+)\.avsc$")


@dataclass(frozen=True, slots=True)
class SchemaVersion:
    """One version of one record schema.

    Attributes:
        name: Short record name (``OrderPlaced``), the event type.
        full_name: Namespaced name (``refold.commerce.OrderPlaced``).
        version: The ``N`` of ``.vN.avsc``.
        fingerprint: 8-byte CRC-64-AVRO fingerprint of the parsing canonical form, little-endian,
            exactly as it appears in the single-object encoding header.
        raw: The schema as written in the file.
        parsed: The schema parsed by fastavro for encode/decode, without logical types: a
            ``timestamp-millis`` field is an ``int`` of epoch milliseconds in Python (decoding
            into ``datetime`` objects would make decoding ~3x slower, measured).
        path: The file it came from.
    """

    name: str
    full_name: str
    version: int
    fingerprint: bytes
    raw: dict[str, Any] = field(repr=False)
    parsed: Any = field(repr=False)
    path: Path = field(repr=False)

    @property
    def fingerprint_hex(self) -> str:
        """The fingerprint as hex, for logs and generation metadata."""
        return self.fingerprint.hex()


def _without_logical_types(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _without_logical_types(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [_without_logical_types(item) for item in schema]
    return schema


def _load(path: Path) -> SchemaVersion:
    match = _FILE_NAME.match(path.name)
    if match is None:
        msg = f"{path}: schema files must be named <RecordName>.v<N>.avsc"
        raise ContractError(msg)
    raw = json.loads(path.read_text())
    parsed: Any = fastavro.parse_schema(_without_logical_types(raw))
    full_name = str(parsed["name"])
    name = full_name.rsplit(".", 1)[-1]
    if name != match["name"]:
        msg = f"{path}: file is named {match['name']} but the record is {name}"
        raise ContractError(msg)
    canonical = to_parsing_canonical_form(raw)
    return SchemaVersion(
        name=name,
        full_name=full_name,
        version=int(match["version"]),
        fingerprint=bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")),
        raw=raw,
        parsed=parsed,
        path=path,
    )


class SchemaCatalog:
    """Every schema version, looked up by fingerprint (decode) or by name (encode).

    Args:
        versions: The versions to hold; see :meth:`from_directory`.

    Raises:
        ContractError: Two files define the same version, or two versions share a fingerprint.
    """

    def __init__(self, versions: Iterable[SchemaVersion]) -> None:
        self._by_fingerprint: dict[bytes, SchemaVersion] = {}
        self._by_name: dict[str, list[SchemaVersion]] = {}
        for version in versions:
            clash = self._by_fingerprint.get(version.fingerprint)
            if clash is not None:
                msg = f"{version.path} and {clash.path} are the same schema (same fingerprint)"
                raise ContractError(msg)
            self._by_fingerprint[version.fingerprint] = version
            family = self._by_name.setdefault(version.name, [])
            if any(v.version == version.version for v in family):
                msg = f"{version.name} v{version.version} is defined twice"
                raise ContractError(msg)
            family.append(version)
        for family in self._by_name.values():
            family.sort(key=lambda v: v.version)

    @classmethod
    def from_directory(cls, root: Path = SCHEMA_ROOT) -> SchemaCatalog:
        """Load every ``*.avsc`` below ``root``."""
        return cls.from_directories([root])

    @classmethod
    def from_directories(cls, roots: Iterable[Path]) -> SchemaCatalog:
        """Load every ``*.avsc`` below each of ``roots`` (a folder listed twice counts once)."""
        unique = sorted({root.resolve() for root in roots})
        return cls(_load(path) for root in unique for path in sorted(root.rglob("*.avsc")))

    def by_fingerprint(self, fp: bytes) -> SchemaVersion:
        """The writer schema of a record.

        Raises:
            UnknownSchemaError: No version has this fingerprint.
        """
        try:
            return self._by_fingerprint[fp]
        except KeyError:
            reason = "unknown-fingerprint"
            detail = f"no schema in the catalog has fingerprint {fp.hex()}"
            raise UnknownSchemaError(reason, detail) from None

    def latest(self, name: str) -> SchemaVersion:
        """The newest version of a record: what producers write and processors read with.

        Raises:
            UnknownEventTypeError: No schema has this record name.
        """
        return self.versions(name)[-1]

    def versions(self, name: str) -> list[SchemaVersion]:
        """Every version of a record, oldest first."""
        try:
            return list(self._by_name[name])
        except KeyError:
            known = ", ".join(sorted(self._by_name))
            msg = f"unknown event type {name!r}; known: {known}"
            raise UnknownEventTypeError(msg) from None

    def names(self) -> list[str]:
        """Every record name, sorted."""
        return sorted(self._by_name)

    def __iter__(self) -> Iterator[SchemaVersion]:
        for name in self.names():
            yield from self._by_name[name]


@cache
def default_catalog() -> SchemaCatalog:
    """The catalog of every installed contract set (loaded once per process).

    The contract sets are the ``refold.contracts`` entry points (:mod:`refold.contracts.registry`),
    each checked against its ``contracts.lock`` (:mod:`contracts.lock`).

    Raises:
        SchemaLockError: A published version was changed or deleted.
        SchemaIncompatibleError: A new version breaks BACKWARD_TRANSITIVE.
    """
    from refold.contracts.lock import verified_catalog  # lock -> compat -> this module
    from refold.contracts.registry import default_registry  # the registry imports this module

    return verified_catalog(default_registry().contract_sets.values())
