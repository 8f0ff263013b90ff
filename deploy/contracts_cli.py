"""``refold contracts check | lock | publish``: the published schema versions of the contract sets.

``check`` prints every contract set (its records, versions, fingerprints, published or new) and
exits 1 when a published version was changed or deleted, or a new version breaks
BACKWARD_TRANSITIVE. ``lock`` publishes every version (writes each set's ``contracts.lock``)
and refuses, with exit 1, the same problems. Run ``lock`` in the source checkout (an editable
install), where the lock files are committed. See :mod:`contracts.lock`. ``publish``
registers every locked version in the schema registry of ``REFOLD_SCHEMA_REGISTRY__URL``
(:mod:`contracts.schema_publish`), and exits 1 when the registry disagrees with the lock.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

from refold.contracts.catalog import SchemaCatalog
from refold.contracts.cli_parser import CommandParser
from refold.contracts.errors import ContractError
from refold.contracts.lock import LockedVersion, SchemaLock, relock, verify, versions_of
from refold.contracts.registry import ContractSet, Registry, default_registry

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``refold contracts`` command line."""
    parser = CommandParser(
        prog="refold contracts",
        description="The published schema versions of the installed contract sets "
        "(each set's contracts.lock).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        (
            "check",
            "list records, versions and fingerprints; exit 1 when a published version was "
            "changed or deleted or a new version is not BACKWARD_TRANSITIVE compatible",
        ),
        (
            "lock",
            "publish every version: write each set's contracts.lock (commit it); refuses, "
            "with exit 1, what check refuses",
        ),
        (
            "publish",
            "register every locked version in the schema registry (REFOLD_SCHEMA_REGISTRY__URL;"
            " subjects by RecordNameStrategy, compatibility BACKWARD_TRANSITIVE); exit 1 when "
            "a subject's versions differ from the lock's",
        ),
    ):
        command = sub.add_parser(name, help=text, description=text)
        command.add_argument(
            "sets", nargs="*", metavar="SET", help="contract set names (default: all)"
        )
    return parser


def _selected(registry: Registry, names: list[str]) -> list[ContractSet]:
    unknown = sorted(set(names) - set(registry.contract_sets))
    if unknown:
        known = ", ".join(sorted(registry.contract_sets)) or "none"
        msg = f"unknown contract set(s) {', '.join(unknown)}; known: {known}"
        raise ContractError(msg)
    return [s for n, s in sorted(registry.contract_sets.items()) if not names or n in names]


def _check(contract_sets: Iterable[ContractSet], registry: Registry) -> int:
    failures: list[str] = []
    new = 0
    for contract_set in contract_sets:
        origin = f" ({contract_set.package})" if contract_set.package else ""
        print(f"{contract_set.name}{origin}: {contract_set.schemas}")
        try:
            versions = versions_of(contract_set)
            locked = SchemaLock.read(contract_set.lock_path)
            problems = verify(contract_set, versions, locked)
        except ContractError as exc:
            print(f"  cannot be checked: {exc}")
            failures.append(f"{contract_set.name}: {exc}")
            continue
        missing = "" if contract_set.lock_path.exists() else " (none yet: nothing published)"
        print(f"  lock: {contract_set.lock_path}{missing}")
        faulty = {(p.record, p.version): p.kind for p in problems}
        for version in versions:
            entry = locked.get(version.name, version.version)
            state = "published"
            if entry is None:
                new += 1
                state = "new, not locked (the producer SDK does not write it)"
            elif entry != LockedVersion.of(version):
                state = "CHANGED since published"
            if (version.name, version.version) in faulty and entry is None:
                state = "new, INCOMPATIBLE"
            print(f"  {version.name:<24} v{version.version:<3} {version.fingerprint_hex}  {state}")
        present = {(v.name, v.version) for v in versions}
        for entry in locked.versions:
            if (entry.record, entry.version) not in present:
                print(
                    f"  {entry.record:<24} v{entry.version:<3} {entry.fingerprint_hex}  "
                    "DELETED (published)"
                )
        failures.extend(str(p) for p in problems)
    try:  # the sets together: no two files share a fingerprint or a record version
        SchemaCatalog.from_directories(registry.schema_dirs())
    except ContractError as exc:
        failures.append(str(exc))
    if failures:
        print(f"\n{len(failures)} problem(s):", *failures, sep="\n  - ")
        print("Operator action: fix each problem as it says, then run `refold contracts check`.")
        return 1
    hint = f"; {new} new version(s): `refold contracts lock` publishes them" if new else ""
    print(f"\ncontracts: ok{hint}")
    return 0


def _write(path: Path, text: str) -> None:
    """Write a lock file, only when it changes, atomically (a reader sees old or new)."""
    if path.exists() and path.read_text() == text:
        return
    staging = path.with_name(path.name + ".tmp")
    staging.write_text(text)
    staging.replace(path)


def _lock(contract_sets: Iterable[ContractSet]) -> int:
    status, changed = 0, False
    for contract_set in contract_sets:
        try:
            text, published = relock(contract_set)
        except ContractError as exc:
            print(f"{contract_set.name}: not locked: {exc}", file=sys.stderr)
            status = 1
            continue
        _write(contract_set.lock_path, text)
        changed |= bool(published)
        names = ", ".join(f"{v.name} v{v.version}" for v in published) or "nothing new"
        print(f"{contract_set.name}: {contract_set.lock_path}: published {names}")
    if changed:
        print("commit the contracts.lock files with the schemas")
    return status


def _publish(contract_sets: Iterable[ContractSet]) -> int:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from refold.contracts.schema_publish import COMPATIBILITY, locked_versions, publish_subject
    from refold.contracts.schema_registry import SchemaRegistrySettings

    settings = SchemaRegistrySettings.from_env()
    try:
        client = SchemaRegistryClient.new_client(settings.client_config())
        subjects = locked_versions(contract_sets)
    except ContractError as exc:
        print(f"refold contracts publish: {exc}", file=sys.stderr)
        return 1
    problems: list[str] = []
    for subject, locked in sorted(subjects.items()):
        report = publish_subject(client, subject, locked)
        problems += report.problems
        if report.problems:
            print(f"  {subject:<40} REFUSED")
            continue
        new = ", ".join(f"v{version} (id {schema_id})" for version, schema_id in report.registered)
        print(
            f"  {subject:<40} {report.present + len(report.registered)} version(s), "
            f"{COMPATIBILITY}; {'registered ' + new if new else 'nothing new'}"
        )
    if problems:
        print(f"\n{len(problems)} problem(s):", *problems, sep="\n  - ", file=sys.stderr)
        print(
            "Operator action: the registry must hold the lock's versions, in order; a subject "
            "that differs was left as it is (delete it in the registry if it is wrong, or fix "
            "the lock as `refold contracts check` says).",
            file=sys.stderr,
        )
        return 1
    print(f"schema registry {settings.url}: agrees with the lock ({len(subjects)} subjects)")
    return 0


def main(argv: list[str] | None = None, *, registry: Registry | None = None) -> int:
    """Run ``refold contracts``; returns the exit code.

    Args:
        argv: The arguments after ``contracts``.
        registry: The contract sets to work on; default the installed ones.
    """
    args = build_parser().parse_args(argv)
    try:
        registry = default_registry() if registry is None else registry
        contract_sets = _selected(registry, args.sets)
    except ContractError as exc:
        print(f"refold contracts: {exc}", file=sys.stderr)
        return 1
    if args.command == "lock":
        return _lock(contract_sets)
    if args.command == "publish":
        return _publish(contract_sets)
    return _check(contract_sets, registry)


if __name__ == "__main__":
    sys.exit(main())
