"""``refold contracts publish``: every locked version into the schema registry, checked against it.

Per record (one subject, RecordNameStrategy: :func:`~refold.contracts.schema_registry.subject_of`)
the registry's versions must be the lock's, in order: registry version *k* holds the schema of
the *k*-th locked version (compared by fingerprint, the parsing canonical form). Then the
subject's compatibility is set to BACKWARD_TRANSITIVE (the lock's own gate) and the locked
versions it lacks are registered, oldest first. A subject whose versions differ from the lock's,
or that has versions the lock does not, is refused and left as it is, as an edited lock is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from refold.contracts.catalog import SchemaVersion
from refold.contracts.lock import SchemaLock, versions_of
from refold.contracts.registry import ContractSet
from refold.contracts.schema_registry import fingerprint_of_text, schema_text, subject_of

__all__ = ["COMPATIBILITY", "SubjectReport", "locked_versions", "publish_subject"]

COMPATIBILITY = "BACKWARD_TRANSITIVE"


@dataclass(slots=True)
class SubjectReport:
    """What publishing did to one subject.

    Attributes:
        subject: The subject (the record's full name).
        present: Locked versions the registry already had, agreeing with the lock.
        registered: ``(version, schema id)`` of each locked version registered now.
        problems: Why the subject was refused (empty: it agrees with the lock now).
    """

    subject: str
    present: int = 0
    registered: list[tuple[int, int]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def locked_versions(contract_sets: Iterable[ContractSet]) -> dict[str, list[SchemaVersion]]:
    """Per subject, the locked (published) versions of the sets, oldest first.

    Raises:
        ContractError: A schema folder or a lock does not load.
    """
    subjects: dict[str, list[SchemaVersion]] = {}
    for contract_set in contract_sets:
        lock = SchemaLock.read(contract_set.lock_path)
        for version in versions_of(contract_set):
            if lock.get(version.name, version.version) is not None:
                subjects.setdefault(subject_of(version), []).append(version)
    for versions in subjects.values():
        versions.sort(key=lambda v: v.version)
    return subjects


def publish_subject(client: Any, subject: str, locked: list[SchemaVersion]) -> SubjectReport:
    """Check one subject against the lock, then set its compatibility and register what lacks.

    Args:
        client: confluent-kafka's ``SchemaRegistryClient``.
        subject: The subject.
        locked: Its locked versions, oldest first.

    Raises:
        SchemaRegistryError: The registry failed (not a refusal of a version: those are
            :attr:`SubjectReport.problems`).
    """
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    report = SubjectReport(subject)
    try:
        existing = sorted(client.get_versions(subject))
    except SchemaRegistryError as exc:
        if exc.http_status_code != 404:  # 404: a new subject
            raise
        existing = []
    for position, number in enumerate(existing):
        found = fingerprint_of_text(str(client.get_version(subject, number).schema.schema_str))
        if position >= len(locked):
            report.problems.append(
                f"{subject}: the registry's version {number} (fingerprint {found.hex()}) is no "
                f"locked version (the lock has {len(locked)})"
            )
            continue
        mine = locked[position]
        if found != mine.fingerprint:
            report.problems.append(
                f"{subject}: the registry's version {number} has fingerprint {found.hex()}, the "
                f"lock's {mine.name} v{mine.version} has {mine.fingerprint_hex}"
            )
    if report.problems:
        return report
    report.present = len(existing)
    client.set_compatibility(subject, COMPATIBILITY)
    for version in locked[len(existing) :]:
        try:
            schema_id = client.register_schema(subject, Schema(schema_text(version), "AVRO"))
        except SchemaRegistryError as exc:
            if exc.http_status_code >= 500:  # an outage, not a refusal
                raise
            report.problems.append(
                f"{subject}: the registry refused {version.name} v{version.version}: {exc}"
            )
            return report
        report.registered.append((version.version, int(schema_id)))
    return report
