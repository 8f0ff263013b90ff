"""Backfill, compaction and status of an archive processor's Parquet files.

The operations behind ``refold archive backfill | compact | status``
(:mod:`refold.processors.runtime.archive.cli`, which also says what each one guarantees).
Backfill and compaction take the archive's maintenance lock and only touch committed files
(those ending at or below the applied position), so they run beside the live archive processor.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

from refold.contracts.codec import EventCodec
from refold.contracts.errors import DeserializationError
from refold.contracts.kafka.offsets import LogOffsets, TopicPartitionKey
from refold.contracts.progress import progress_bar
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.watermarks import is_marker
from refold.processors.fold.archive import (
    ArchiveTable,
    Coverage,
    RecordBytes,
    date_dir,
    overlapping,
    redundant,
)
from refold.processors.fold.records import SourceRecord
from refold.processors.runtime.archive.sink import ArchivePlan
from refold.processors.runtime.archive.store import ArchiveStore, unify
from refold.processors.runtime.kafka_ranges import SourceOptions, read_messages

__all__ = [
    "BackfillResult",
    "CompactResult",
    "TableStatus",
    "archive_status",
    "backfill",
    "compact",
]

# Rows of one (type, date) group kept as dicts before they become an Arrow batch (memory).
_ROWS_PER_BATCH = 5_000


@dataclass(slots=True)
class BackfillResult:
    """What a backfill did."""

    records: int = 0  # read from the log
    rows: int = 0  # written (log rows in range, and rows carried over from below the log start)
    files_written: int = 0
    files_removed: int = 0
    undecodable: int = 0  # skipped (the live processor dead-lettered them)
    not_archived: list[str] = field(default_factory=list)  # partitions without a position


@dataclass(slots=True)
class CompactResult:
    """What a compaction did."""

    groups: int = 0  # (type, date, partition) merged
    files_merged: int = 0
    files_removed: int = 0  # by the redundancy rule (merged files and crash leftovers)
    rows: int = 0


@dataclass(slots=True)
class TableStatus:
    """One table of the archive."""

    dates: int = 0
    first: str = ""
    last: str = ""
    files: int = 0
    rows: int = 0
    bytes: int = 0


def _applied(plan: ArchivePlan) -> dict[TopicPartitionKey, int]:
    """The archive generation's applied positions (what its files are committed up to)."""
    client = redis_client(plan.target.redis_url)
    registry = GenerationRegistry.of(client, plan.target.processor, plan.target.key_prefix)
    return registry.positions(plan.target.generation)[0]


def _sorted_unique(table: pa.Table) -> pa.Table:
    """Rows in offset order, one per offset (an offset is one event of the partition)."""
    ordered = table.sort_by("kafka_offset")
    offsets = ordered.column("kafka_offset").to_numpy()
    if len(offsets) < 2:
        return ordered
    keep = np.concatenate(([True], offsets[1:] != offsets[:-1]))
    return ordered if bool(keep.all()) else ordered.filter(pa.array(keep))


def _wanted_type(codec: EventCodec, value: bytes | None, types: frozenset[str]) -> bool:
    """Whether a record is of one of ``types``, read off its header (undecodable: True).

    The writer is cached per fingerprint by ``codec``, so pass the same codec for every record.
    """
    writer = codec.writer_of(value)
    return writer is None or writer.name in types


def _read_dates(
    plan: ArchivePlan,
    span: tuple[str, int, int, int],
    dates: tuple[str, str],
    types: frozenset[str],
    tables: dict[str, ArchiveTable],
    result: BackfillResult,
    bar: tqdm[Any] | None,
) -> dict[tuple[str, str], list[pa.RecordBatch]]:
    """The log records of ``span`` of ``types`` dated within ``dates``, grouped by (type, date)."""
    codec = plan.codec
    rows: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    out: dict[tuple[str, str], list[pa.RecordBatch]] = defaultdict(list)
    options = SourceOptions(kafka=plan.target.kafka, topics=(span[0],))
    for chunk in read_messages(options, (span,), slot="backfill"):
        result.records += len(chunk)
        if bar is not None:
            bar.update(len(chunk))
        for message in chunk:
            record = SourceRecord.of_message(message)
            if is_marker(record.headers) or not _wanted_type(codec, record.value, types):
                continue
            try:
                event = codec.decode(record.value)
            except DeserializationError:
                result.undecodable += 1
                continue
            if event.event_type not in types:
                continue
            table = tables.get(event.event_type)
            if table is None:
                reader = codec.reader_for(event.event_type)
                table = tables[event.event_type] = plan.archive.table(
                    reader.raw, reader.fingerprint_hex
                )
            date = table.date_of(event.data, record.timestamp)
            if not dates[0] <= date <= dates[1]:
                continue
            origin = (record.topic, record.partition, record.offset, record.timestamp, record.key)
            group = rows[event.event_type, date]
            kept = RecordBytes(record.value, record.headers or (), record.timestamp_type)
            group.append(table.row(event.data, origin, event.writer.version, kept))
            if len(group) >= _ROWS_PER_BATCH:
                out[event.event_type, date].append(
                    pa.RecordBatch.from_pylist(group, schema=table.schema)
                )
                group.clear()
    for key, group in rows.items():
        if group:
            out[key].append(pa.RecordBatch.from_pylist(group, schema=tables[key[0]].schema))
    return out


def backfill(
    plan: ArchivePlan,
    topics: Sequence[str],
    date_from: str,
    date_to: str,
    types: Iterable[str] | None = None,
    *,
    progress: bool = False,
) -> BackfillResult:
    """Re-archive the events of ``types`` dated ``date_from``..``date_to`` (see the module doc).

    Raises:
        ArchiveBusyError: Another backfill or compaction runs.
    """
    store = plan.store
    wanted = frozenset(types or (*plan.archive.event_types, *store.tables()))
    result = BackfillResult()
    tables: dict[str, ArchiveTable] = {}
    with store.maintenance():
        applied = _applied(plan)
        probe = LogOffsets(dict(plan.target.kafka))
        try:
            tps = [(t, p) for t in topics for p in probe.partitions(t)]
            starts = probe.start_offsets(tps)
        finally:
            probe.close()
        total = sum(max(0, applied.get(tp, 0) - starts[tp]) for tp in tps)
        bar = progress_bar(total=total, unit="ev", desc="backfill", shown=progress, leave=False)
        with bar:
            for topic, partition in tps:
                end = applied.get((topic, partition))
                if end is None:
                    result.not_archived.append(f"{topic}/{partition}")
                    continue
                start = starts[topic, partition]
                span = (topic, partition, start, max(start, end))
                found = _read_dates(plan, span, (date_from, date_to), wanted, tables, result, bar)
                on_disk = {
                    (t, d) for t in wanted for d in store.dates(t) if date_from <= d <= date_to
                }
                for event_type, date in sorted(set(found) | on_disk):
                    batches = found.get((event_type, date), [])
                    _rewrite(
                        store, (topic, partition, start, end), event_type, date, batches, result
                    )
    return result


def _rewrite(
    store: ArchiveStore,
    span: tuple[str, int, int, int],
    event_type: str,
    date: str,
    batches: list[pa.RecordBatch],
    result: BackfillResult,
) -> None:
    """One (type, date) of one partition: one file covering the archived range, then the rule."""
    topic, partition, log_start, end = span
    directory = date_dir(store.root, event_type, date)
    committed = [
        (c, path)
        for c, path in store.files(directory)
        if (c.topic, c.partition) == (topic, partition) and c.end <= end
    ]
    parts = [pa.Table.from_batches(batches)] if batches else []
    for cov, path in committed:
        if cov.start < log_start:  # rows the log no longer has (retention): keep them
            old = pq.read_table(path)
            parts.insert(0, old.filter(pc.less(old.column("kafka_offset"), log_start)))
    start = min([log_start, *(c.start for c, _p in committed)])
    rows = sum(p.num_rows for p in parts)
    if not rows:
        # The log holds nothing of this type and date any more, and neither do these files.
        store.remove([path for _c, path in committed])
        result.files_removed += len(committed)
        return
    if end <= start:
        return
    store.write(directory, Coverage(topic, partition, start, end), _sorted_unique(unify(parts)))
    result.files_written += 1
    result.rows += rows
    result.files_removed += len(store.apply_rule(directory))


def compact(
    plan: ArchivePlan,
    date_from: str = "0001-01-01",
    date_to: str = "9999-12-31",
    types: Iterable[str] | None = None,
    *,
    min_files: int = 2,
    progress: bool = False,
) -> CompactResult:
    """Merge each (type, date, partition)'s committed files into one (see the module doc).

    Raises:
        ArchiveBusyError: Another backfill or compaction runs.
    """
    store = plan.store
    wanted = set(types) if types else None
    result = CompactResult()
    with store.maintenance():
        applied = _applied(plan)
        dirs = [
            (t, d, path)
            for t, d, path in store.date_dirs()
            if (wanted is None or t in wanted) and date_from <= d <= date_to
        ]
        for _event_type, _date, directory in progress_bar(
            dirs, unit="dir", desc="compact", shown=progress, leave=False
        ):
            result.files_removed += len(store.apply_rule(directory))  # repair first
            by_partition: dict[TopicPartitionKey, list[tuple[Coverage, Path]]] = defaultdict(list)
            for cov, path in store.files(directory):
                position = applied.get((cov.topic, cov.partition))
                if position is not None and cov.end <= position:  # committed only
                    by_partition[cov.topic, cov.partition].append((cov, path))
            for (topic, partition), files in sorted(by_partition.items()):
                if len(files) < min_files:
                    continue
                merged = _sorted_unique(unify([pq.read_table(path) for _c, path in files]))
                cover = Coverage(
                    topic, partition, min(c.start for c, _p in files), max(c.end for c, _p in files)
                )
                store.write(directory, cover, merged)
                result.groups += 1
                result.files_merged += len(files)
                result.rows += merged.num_rows
                result.files_removed += len(store.apply_rule(directory))
    return result


def archive_status(
    plan: ArchivePlan, *, progress: bool = False
) -> tuple[dict[str, TableStatus], list[str]]:
    """Per table its dates, files, rows and bytes; and what needs an operator (one line each)."""
    store = plan.store
    applied = _applied(plan)
    tables: dict[str, TableStatus] = {}
    problems: list[str] = []
    dirs = list(store.date_dirs())
    for event_type, date, directory in progress_bar(
        dirs, unit="dir", desc="status", shown=progress, leave=False
    ):
        table = tables.setdefault(event_type, TableStatus(first=date))
        files = store.files(directory)
        if not files:
            continue
        table.dates += 1
        table.last = date
        where = f"{event_type}/event_date={date}"
        covs = [c for c, _p in files]
        if stale := redundant(covs):
            problems.append(
                f"{where}: {len(stale)} files lie within another (a compaction or backfill "
                "stopped between its two steps). Operator action: refold archive compact"
            )
        for first, second in overlapping(covs):
            problems.append(
                f"{where}: {first.file_name} and {second.file_name} overlap (copied in by "
                "hand?). Operator action: refold archive compact (it merges them by offset)"
            )
        for cov, path in files:
            table.files += 1
            table.rows += pq.read_metadata(path).num_rows
            table.bytes += path.stat().st_size
            position = applied.get((cov.topic, cov.partition), -1)
            if cov.end > position:
                problems.append(
                    f"{where}/{cov.file_name}: past the applied position {position} (a batch "
                    "in flight, or left by a crash; the writer removes it on its next batch)"
                )
        if temporaries := store.temporaries(directory):
            problems.append(
                f"{where}: {len(temporaries)} half-written files (.*.tmp, invisible to readers) "
                "from a crash; the writer or a compaction removes them"
            )
    return tables, problems
