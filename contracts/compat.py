"""The BACKWARD_TRANSITIVE gate: the newest version of a record reads every older version.

Uses Apache Avro's own ``ReaderWriterCompatibilityChecker`` (the Python port of the Java
checker the Confluent registry uses) rather than a hand-written rule set.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import avro.compatibility
import avro.schema

from refold.contracts.catalog import SchemaCatalog, SchemaVersion
from refold.contracts.errors import SchemaIncompatibleError

__all__ = ["CompatibilityProblem", "check_backward_transitive", "check_catalog", "reader_problem"]


@dataclass(frozen=True, slots=True)
class CompatibilityProblem:
    """One reader/writer pair that does not resolve."""

    reader: SchemaVersion
    writer: SchemaVersion
    details: str

    def __str__(self) -> str:
        return (
            f"{self.reader.name} v{self.reader.version} cannot read v{self.writer.version}: "
            f"{self.details}"
        )


def reader_problem(reader: SchemaVersion, writer: SchemaVersion) -> CompatibilityProblem | None:
    """Why ``reader`` cannot read data written with ``writer`` (None: it can)."""
    checker = avro.compatibility.ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]
    result = checker.get_compatibility(
        avro.schema.parse(json.dumps(reader.raw)), avro.schema.parse(json.dumps(writer.raw))
    )
    if result.compatibility is avro.compatibility.SchemaCompatibilityType.compatible:
        return None
    kinds = ", ".join(sorted(str(k.value) for k in result.incompatibilities))
    fields = ", ".join(sorted(result.messages))
    where = ", ".join(sorted(result.locations))
    return CompatibilityProblem(reader, writer, f"{kinds} ({fields}) at {where}")


def check_backward_transitive(versions: list[SchemaVersion]) -> list[CompatibilityProblem]:
    """Check that every version reads every older version of the same record.

    Args:
        versions: One record family, any order.

    Returns:
        Every pair that fails; empty when the family is compatible.
    """
    ordered = sorted(versions, key=lambda v: v.version)
    problems = []
    for i, reader in enumerate(ordered):
        for writer in ordered[:i]:
            problem = reader_problem(reader, writer)
            if problem is not None:
                problems.append(problem)
    return problems


def check_catalog(catalog: SchemaCatalog) -> None:
    """Run the gate over every record family of a catalog.

    Raises:
        SchemaIncompatibleError: Lists every failing pair, with what to do.
    """
    problems = [
        p for name in catalog.names() for p in check_backward_transitive(catalog.versions(name))
    ]
    if problems:
        lines = "\n  ".join(str(p) for p in problems)
        msg = (
            f"schemas are not BACKWARD_TRANSITIVE compatible:\n  {lines}\n"
            "Operator action: give new fields a default, never remove a field without a default, "
            "and never change a field's type incompatibly; add a new version file instead."
        )
        raise SchemaIncompatibleError(msg)
