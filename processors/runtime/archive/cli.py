"""``refold archive backfill | compact | status``: maintain an archive processor's Parquet files.

* ``backfill --from D --to D [--types T,...]``: re-archive dates from the log. Per Kafka
  partition, it reads the log from its start up to the archive's applied position ``A`` and
  writes, per event type and date in range, ONE file covering ``[log start, A)`` (rows of older
  files below the log start, which retention removed from Kafka, are carried over); the
  redundancy rule then deletes the files it replaces. No duplicates, no gaps, whatever ran
  before; a crash leaves the old files or the new one plus files the rule deletes next time.
* ``compact``: merge the committed files of each (type, date, partition) into one covering file
  (rows de-duplicated by offset), then the rule deletes the small ones; repairs a crash between
  the two steps of an earlier compaction or backfill.
* ``status``: tables, dates, files, rows and bytes, and anything that needs an operator.

Backfill and compaction take the archive's maintenance lock and only touch committed files (those
ending at or below the applied position), so they run beside the live archive processor.
Settings as the processor's: ``REFOLD_KAFKA__*``, ``REFOLD_REDIS__*``, ``REFOLD_STATE_DIR`` and
``REFOLD_<PROCESSOR>__*`` (e.g. ``REFOLD_ARCHIVE__ROOT``). This module reads the environment;
the operations themselves are :mod:`refold.processors.runtime.archive.maintenance`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from dataclasses import asdict

from refold.contracts.cli_parser import CommandParser
from refold.contracts.codec import EventCodec
from refold.contracts.errors import RefoldError
from refold.contracts.registry import default_registry, import_reference
from refold.contracts.topics import dead_letter_topic
from refold.processors.fold.archive import ArchiveProcessor
from refold.processors.runtime.archive.maintenance import archive_status, backfill, compact
from refold.processors.runtime.archive.sink import ArchivePlan
from refold.processors.runtime.archive.store import ArchiveError, ArchiveStore
from refold.processors.runtime.envelope import FoldTarget

__all__ = ["build_parser", "main"]


def _date(text: str) -> str:
    try:
        return dt.date.fromisoformat(text).isoformat()
    except ValueError:
        msg = f"expected a date YYYY-MM-DD, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None


def _types(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def build_parser() -> argparse.ArgumentParser:
    """The ``refold archive`` command line."""
    parser = CommandParser(
        prog="refold archive",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Maintain an archive processor's Parquet files (docs/archive.md):\n"
        "  <root>/<EventType>/event_date=YYYY-MM-DD/<topic>~p<partition>~<start>-<end>.parquet\n"
        "Settings: REFOLD_KAFKA__*, REFOLD_REDIS__*, REFOLD_STATE_DIR and the processor's\n"
        "REFOLD_<PROCESSOR>__* (e.g. REFOLD_ARCHIVE__ROOT), as the processor has them.",
        epilog="examples:\n"
        "  refold archive status\n"
        "  refold archive backfill --from 2026-01-01 --to 2026-01-31 --types OrderPaid\n"
        "  refold archive compact --to 2026-01-31",
    )
    parser.add_argument(
        "--processor", default="archive", help="the archive processor (default: archive)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    fill = sub.add_parser(
        "backfill",
        help="re-archive dates from the log, without duplicates",
        description="Re-read the log and rewrite each date in range, per event type and Kafka "
        "partition, as one file covering everything archived so far; the files it replaces "
        "are deleted. Runs beside the live archive processor.",
    )
    fill.add_argument(
        "--from", dest="date_from", type=_date, required=True, metavar="DATE", help="YYYY-MM-DD"
    )
    fill.add_argument(
        "--to", dest="date_to", type=_date, required=True, metavar="DATE", help="YYYY-MM-DD"
    )
    fill.add_argument(
        "--types", type=_types, metavar="T,T", help="event types, comma-separated (default: all)"
    )
    merge = sub.add_parser(
        "compact",
        help="merge small files into one per event type, date and partition",
        description="Merge the committed files of each event type, date and Kafka partition "
        "into one file, then delete the small ones. Also repairs an earlier compaction or "
        "backfill that stopped half way.",
    )
    merge.add_argument(
        "--from",
        dest="date_from",
        type=_date,
        default="0001-01-01",
        metavar="DATE",
        help="first event date to compact (default: all)",
    )
    merge.add_argument(
        "--to",
        dest="date_to",
        type=_date,
        default="9999-12-31",
        metavar="DATE",
        help="last event date to compact (default: all)",
    )
    merge.add_argument(
        "--types", type=_types, metavar="T,T", help="event types, comma-separated (default: all)"
    )
    merge.add_argument(
        "--min-files", type=int, default=2, help="merge a partition's files from this many (2)"
    )
    state = sub.add_parser("status", help="tables, dates, files, rows; what needs an operator")
    state.add_argument("--json", action="store_true", help="as JSON")
    return parser


def _plan(name: str) -> tuple[ArchivePlan, list[str]]:
    """The archive's plan (its owning generation) and topics, from the environment."""
    from refold.processors.runtime.cli import ProcessSettings, load_options

    settings = ProcessSettings()
    spec = default_registry().processor(name)
    options = load_options(spec, os.environ)
    archive = import_reference(spec.projection)(options)
    if not isinstance(archive, ArchiveProcessor):
        msg = f"{name} is not an archive processor"
        raise ArchiveError(msg)
    store = ArchiveStore(archive.root)
    owner = store.owner()
    if owner is None:
        msg = f"nothing archived at {archive.root} yet (run the {name} processor first)"
        raise ArchiveError(msg)
    prefix = settings.redis.key_prefix
    if (owner.get("processor"), owner.get("key_prefix")) != (name, prefix):
        msg = (
            f"the archive at {archive.root} belongs to {owner.get('processor')} under key "
            f"prefix {owner.get('key_prefix')!r}, not {name} under {prefix!r}. Operator action: "
            "set REFOLD_REDIS__KEY_PREFIX and REFOLD_<PROCESSOR>__ROOT as the processor has them."
        )
        raise ArchiveError(msg)
    target = FoldTarget(
        processor=name,
        generation=int(owner["generation"]),
        redis_url=settings.redis.client_url(),
        key_prefix=prefix,
        kafka=tuple(sorted(settings.kafka.as_librdkafka().items())),
        dlq_topic=dead_letter_topic(name, options.dead_letter_topic),
    )
    return ArchivePlan(target, archive, EventCodec()), list(options.topics or spec.topics)


def _print_status(plan: ArchivePlan, as_json: bool) -> int:
    tables, problems = archive_status(plan, progress=not as_json and sys.stderr.isatty())
    if as_json:
        print(
            json.dumps(
                {
                    "root": str(plan.archive.root),
                    "generation": plan.target.generation,
                    "tables": {t: asdict(s) for t, s in sorted(tables.items())},
                    "problems": problems,
                },
                indent=2,
            )
        )
        return 0
    print(f"archive {plan.target.processor} g{plan.target.generation} at {plan.archive.root}")
    print(f"{'table':<22} {'dates':>5} {'first':>10}  {'last':>10} {'files':>7} {'rows':>12}  size")
    for name, table in sorted(tables.items()):
        print(
            f"{name:<22} {table.dates:>5} {table.first:>10}  {table.last:>10} {table.files:>7,} "
            f"{table.rows:>12,}  {table.bytes / 1e6:,.1f} MB"
        )
    for problem in problems[:50]:
        print(f"! {problem}")
    if len(problems) > 50:
        print(f"! ... and {len(problems) - 50} more (--json lists them all)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; the exit code (1 on an archive error, 2 on bad usage)."""
    args = build_parser().parse_args(argv)
    try:
        plan, topics = _plan(args.processor)
        if args.command == "status":
            return _print_status(plan, args.json)
        if args.command == "backfill":
            if args.date_from > args.date_to:
                print("refold archive: --from is after --to", file=sys.stderr)
                return 2
            print(
                f"backfill {args.date_from}..{args.date_to} of {plan.archive.root}: reading "
                f"{', '.join(topics)} up to the applied positions of g{plan.target.generation}",
                flush=True,
            )
            filled = backfill(plan, topics, args.date_from, args.date_to, args.types, progress=True)
            print(
                f"{filled.records:,} records read, {filled.rows:,} rows in "
                f"{filled.files_written:,} files written, {filled.files_removed:,} files "
                f"replaced, {filled.undecodable:,} undecodable records skipped"
            )
            if filled.not_archived:
                print(f"not archived yet (no position): {', '.join(filled.not_archived)}")
            return 0
        merged = compact(
            plan, args.date_from, args.date_to, args.types, min_files=args.min_files, progress=True
        )
        print(
            f"{merged.groups:,} groups compacted: {merged.files_merged:,} files merged into "
            f"{merged.groups:,} ({merged.rows:,} rows), {merged.files_removed:,} files removed"
        )
        return 0
    except RefoldError as exc:
        print(f"refold archive: {exc}", file=sys.stderr)
        return 1
