"""The archive's writer: each micro-batch's events as Parquet files, exactly once, in Spark tasks.

The query is ``refold_kafka_ranges -> foreachBatch(ArchiveSink)``; the sink runs one task per
group of partition ranges (:func:`archive_ranges`, executor side): after a checkpoint's first
batch as an RDD job the driver plans from the offsets log, as the fold sink does
(:mod:`refold.processors.runtime.sink`), else ``mapInArrow`` over the source. Per Kafka
partition ``(topic, partition)`` of its ranges a task:

1. reads the partition's applied position ``A`` in Redis (the truth, DESIGN.md decision 9) and
   skips the range if ``A`` is at or past its end; otherwise it archives ``[A, end)`` (also when
   ``A`` is below the planned start: Redis lost writes, the gap is read again);
2. makes the partition's files agree with ``A`` (``ArchiveStore.reconcile``): files a crashed
   attempt wrote past ``A`` are deleted;
3. reads ``[A, end)``, decodes every record with its writer schema resolved to the reader's
   (one table per event type) and groups them by event type and event date;
4. records its intent (where it will write), then writes one file per group, named by the
   range it covers, ``<topic>~p<partition>~<A>-<end>.parquet`` (temporary name + rename; a re-run
   writes the same names);
5. dead-letters what does not decode (acknowledged before step 6), with reason and origin,
   once: a generation being rebuilt does not send a letter the live generation sent for the
   same record and reason (:mod:`~refold.processors.runtime.dead_letter_index`);
6. moves the positions from ``A`` to ``end`` in ONE transaction guarded by ``WATCH`` on the
   partitions' guard keys, as the fold envelope does, with the letters it decided in the
   generation's dead-letter index.

So a batch's files are committed exactly when its positions move: a re-run batch finds the
positions moved and writes nothing; a crash between 4 and 6 leaves files the next attempt
deletes (or rewrites under the same names) before it writes its own. Readers never see an
event twice; they may see a batch's files a moment before its positions move.

The worker's Redis client, producer and tables, and the guarded commit of step 6, are
:mod:`refold.processors.runtime.archive.writer`.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa

from refold.contracts.archive_coverage import CoveredRanges
from refold.contracts.codec import EventCodec
from refold.contracts.errors import DeserializationError
from refold.contracts.layout import position_field
from refold.contracts.schema_registry import SchemaRegistryUnavailableError
from refold.contracts.watermarks import is_marker
from refold.processors.errors import (
    ProcessorConfigError,
)
from refold.processors.fold.archive import (
    ArchiveProcessor,
    ArchiveSchemaError,
    ArchiveTable,
    Coverage,
    RecordBytes,
    date_dir,
)
from refold.processors.fold.records import SourceRecord
from refold.processors.runtime.archive.store import ArchiveStore, Intent
from refold.processors.runtime.archive.writer import ArchiveWriter, redis_call, writer_of
from refold.processors.runtime.batch_stats import BatchStatsRecorder
from refold.processors.runtime.dead_letter_index import send_once
from refold.processors.runtime.dead_letters import DeadLetter
from refold.processors.runtime.envelope import FoldTarget
from refold.processors.runtime.fold_target import add_outcome
from refold.processors.runtime.group_mirror import ConsumerGroupMirror
from refold.processors.runtime.kafka_ranges import Range, SourceOptions, TaskPlan, read_messages
from refold.processors.runtime.offset_log import planned_ranges
from refold.processors.runtime.outcome_rows import OutcomeRows
from refold.processors.runtime.sink import ranges_of, run_planned_tasks

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = [
    "ARCHIVE_OUTCOME_SCHEMA",
    "ArchiveOutcome",
    "ArchivePlan",
    "ArchiveSink",
    "archive_ranges",
    "prepare_archive",
    "start_archive_query",
]

logger = logging.getLogger(__name__)

# Rows of one (event type, date) group kept as Python dicts before they become an Arrow batch:
# Arrow holds a row in ~5x less memory than a decoded dict.
_ROWS_PER_BATCH = 5_000


@dataclass(frozen=True, slots=True)
class ArchivePlan:
    """What an archive task needs: built on the driver, pickled into every task.

    Attributes:
        target: The generation (Redis positions, Kafka settings, dead-letter topic).
        archive: The archive processor (root, dates, Parquet settings).
        codec: The driver's contracts (executors decode with the driver's catalog).
    """

    target: FoldTarget
    archive: ArchiveProcessor
    codec: EventCodec

    @property
    def store(self) -> ArchiveStore:
        """The archive's files."""
        return ArchiveStore(self.archive.root, self.archive.compression, self.archive.fsync)


@dataclass(slots=True)
class ArchiveOutcome:
    """What archiving some ranges did."""

    records: int = 0
    archived: int = 0
    skipped: int = 0
    undecodable: int = 0
    files: int = 0
    suppressed_letters: int = 0  # a rebuild's letters the live generation had sent
    positions: dict[str, int] = field(default_factory=dict)
    dead_letters: dict[str, int] = field(default_factory=dict)

    def merge(self, other: ArchiveOutcome) -> None:
        """Add another task's outcome."""
        add_outcome(self, other)

    def describe(self) -> str:
        """One line for the log."""
        return (
            f"{self.records} records, {self.archived} archived in {self.files} files, "
            f"{self.skipped} already archived, {self.undecodable} undecodable"
        )


class _Group:
    """The rows of one (event type, date) of one partition, as Arrow batches."""

    def __init__(self, table: ArchiveTable) -> None:
        self.table = table
        self.rows: list[dict[str, Any]] = []
        self.batches: list[pa.RecordBatch] = []

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if len(self.rows) >= _ROWS_PER_BATCH:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.batches.append(pa.RecordBatch.from_pylist(self.rows, schema=self.table.schema))
            self.rows = []

    def to_table(self) -> pa.Table:
        self.flush()
        return pa.Table.from_batches(self.batches, schema=self.table.schema)


def _decode_into(
    writer: ArchiveWriter,
    record: SourceRecord,
    groups: dict[tuple[str, str], _Group],
    dead: list[tuple[SourceRecord, DeserializationError]],
) -> bool:
    """Decode one record into its group; a dead letter (False) when it does not decode.

    A watermark marker of an output stream is no event: not archived as one, not a dead
    letter. It, and a record that goes to the dead-letter topic, is kept in the raw table
    (:data:`~refold.processors.fold.archive.RAW_TABLE`): a replay from the archive hands
    every record of a range over, as Kafka would.
    """
    if is_marker(record.headers):
        _add_row(groups, _RAW, {}, record, 0)
        return False
    try:
        event = writer.plan.codec.decode(record.value)
    except DeserializationError as exc:
        dead.append((record, exc))
        _add_row(groups, _RAW, {}, record, 0)
        return False
    except SchemaRegistryUnavailableError:
        raise  # the registry is down: the batch fails and runs again, nothing is skipped
    except Exception as exc:  # the codec's own guard missed a kind: still this record only
        dead.append((record, DeserializationError("undecodable", repr(exc), record.value)))
        _add_row(groups, _RAW, {}, record, 0)
        return False
    try:
        table = writer.table(event.event_type)
    except ArchiveSchemaError as exc:  # a type outside the archive's own, with no Parquet form
        dead.append((record, DeserializationError("unarchivable", str(exc), record.value)))
        _add_row(groups, _RAW, {}, record, 0)
        return False
    _add_row(groups, table, event.data, record, event.writer.version)
    return True


def _cover(start: int, end: int, covered: CoveredRanges) -> CoveredRanges:
    return covered.add(start, end)


# The table of the records that are no archivable event (made once).
_RAW = ArchiveTable.raw()


def _add_row(
    groups: dict[tuple[str, str], _Group],
    table: ArchiveTable,
    data: dict[str, Any],
    record: SourceRecord,
    schema_version: int,
) -> None:
    """Add the row of ``record`` (decoded as ``data``) to its (table, date) group."""
    date = table.date_of(data, record.timestamp)
    group = groups.get((table.event_type, date))
    if group is None:
        group = groups[table.event_type, date] = _Group(table)
    origin = (record.topic, record.partition, record.offset, record.timestamp, record.key)
    kept = RecordBytes(record.value, record.headers or (), record.timestamp_type)
    group.add(table.row(data, origin, schema_version, kept))


def _send_dead_letters(
    writer: ArchiveWriter,
    dead: list[tuple[SourceRecord, DeserializationError]],
    batch_id: int,
    outcome: ArchiveOutcome,
) -> dict[str, str]:
    """Produce the undecodable records a rebuild has not sent yet; wait for every ack.

    Returns:
        The letters' entries of the generation's dead-letter index (written at the commit).
    """
    target = writer.plan.target
    letters = [DeadLetter(record, exc.reason, str(exc)) for record, exc in dead]
    decision = redis_call(
        target,
        writer.redis,
        lambda: send_once(writer.redis, writer.producer, target, letters, batch_id),
    )
    outcome.suppressed_letters = decision.suppressed
    return decision.entries


# A task's ArchiveOutcome crosses to the driver as one Arrow row (see OutcomeRows).
_OUTCOME_ROWS = OutcomeRows(ArchiveOutcome)
ARCHIVE_OUTCOME_SCHEMA = _OUTCOME_ROWS.ddl


def archive_ranges(plan: ArchivePlan, ranges: tuple[Range, ...], batch_id: int) -> ArchiveOutcome:
    """Archive the records of ``ranges`` exactly once (executor side; see the module docstring).

    Idempotent: run again (a retried task, a re-executed batch), it writes nothing new.

    Args:
        plan: The archive and its generation.
        ranges: ``(topic, partition, start, end)`` of the task, end exclusive.
        batch_id: Spark's batch id, stored with the positions.

    Raises:
        SinkConflictError: Another writer moved the positions.
        DeadLetterError: A dead letter was not acknowledged (nothing committed).
        StateStoreUnavailableError: Redis stayed unreachable.
        RuntimeError: Reading the log failed (see ``read_messages``); Spark retries the task.
    """
    outcome = ArchiveOutcome()
    if not ranges:
        return outcome
    writer = writer_of(plan)
    store = plan.store
    applied = writer.applied(sorted({position_field(t, p) for t, p, _s, _e in ranges}))
    todo: list[Range] = []
    for topic, partition, start, end in ranges:
        begin = applied.get(position_field(topic, partition), start)
        outcome.records += end - start
        if begin >= end:
            outcome.skipped += end - start
            continue
        outcome.skipped += max(0, begin - start)
        todo.append((topic, partition, begin, end))
    if not todo:
        return outcome
    for topic, partition, begin, _end in todo:
        store.reconcile(topic, partition, begin)
    groups: dict[tuple[str, int], dict[tuple[str, str], _Group]] = {
        (t, p): {} for t, p, _s, _e in todo
    }
    dead: list[tuple[SourceRecord, DeserializationError]] = []
    options = SourceOptions(kafka=plan.target.kafka, topics=tuple(sorted({r[0] for r in todo})))
    for chunk in read_messages(options, tuple(todo)):
        for message in chunk:
            record = SourceRecord.of_message(message)
            if _decode_into(writer, record, groups[record.topic, record.partition], dead):
                outcome.archived += 1
    root = plan.archive.root
    for topic, partition, begin, end in todo:
        mine = groups[topic, partition]
        dirs = tuple(sorted(str(date_dir(Path(), t, d)) for t, d in mine))
        store.write_intent(topic, partition, Intent(begin, end, dirs))
        coverage = Coverage(topic, partition, begin, end)
        for (event_type, date), group in sorted(mine.items()):
            store.write(date_dir(root, event_type, date), coverage, group.to_table())
            outcome.files += 1
        # Every record of the range is in a file now, whatever it was: the range is covered
        # (a replay below the log start may read it; reconcile cuts it back with the files).
        store.ledger.update(topic, partition, functools.partial(_cover, begin, end))
    entries: dict[str, str] = {}
    if dead:
        outcome.undecodable = len(dead)
        outcome.dead_letters = dict(Counter(exc.reason for _record, exc in dead))
        entries = _send_dead_letters(writer, dead, batch_id, outcome)
    moves = {position_field(t, p): (applied.get(position_field(t, p)), e) for t, p, _b, e in todo}
    redis_call(plan.target, writer.redis, lambda: writer.commit(moves, batch_id, outcome, entries))
    outcome.positions = {f: end for f, (_expected, end) in moves.items()}
    return outcome


def _archive_task(
    plan: ArchivePlan, batch_id: int, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` (executor side): archive the task's ranges; one outcome row."""
    outcome = archive_ranges(plan, ranges_of(batches), batch_id)
    if outcome.records:
        yield from _OUTCOME_ROWS.rows(outcome)


def _planned_archive_task(
    plan: ArchivePlan,
    batch_id: int,
    groups: tuple[tuple[Range, ...], ...],
    index: int,
    _rows: Iterator[int],
) -> Iterator[ArchiveOutcome]:
    """Executor side, tasks planned by the driver: task ``index`` archives ``groups[index]``."""
    outcome = archive_ranges(plan, groups[index], batch_id)
    if outcome.records:
        yield outcome


def prepare_archive(
    target: FoldTarget, archive: ArchiveProcessor, codec: EventCodec, source_format: str
) -> ArchivePlan:
    """Check an archive run and take ownership of its files (driver side, before the query).

    Raises:
        ProcessorConfigError: Not the ``refold_kafka_ranges`` source, an event type without
            a Parquet schema, or the files belong to another processor or generation
            (:class:`~refold.processors.runtime.archive.store.ArchiveOwnerError`).
    """
    if source_format != "refold_kafka_ranges":
        msg = (
            f"{archive.name} archives each partition range in the task that reads it, which "
            f"needs the refold_kafka_ranges source, not {source_format}. Operator action: "
            f"unset REFOLD_{archive.name.upper()}__SOURCE_FORMAT."
        )
        raise ProcessorConfigError(msg)
    try:
        archive.check([codec.reader_for(t).raw for t in archive.event_types])
    except ArchiveSchemaError as exc:
        msg = f"{archive.name}: {exc}"
        raise ProcessorConfigError(msg) from exc
    plan = ArchivePlan(target, archive, codec)
    plan.store.claim(target.processor, target.key_prefix, target.generation)
    for event_type in archive.event_types:
        reader = codec.reader_for(event_type)
        if archive.table(reader.raw).time_field is None:
            logger.info(
                "%s: %s events are dated by their Kafka timestamp", archive.name, event_type
            )
    logger.info("%s g%d archives to %s", archive.name, target.generation, archive.root)
    return plan


class ArchiveSink:
    """The ``foreachBatch`` function of an archive query (driver side, picklable).

    Args:
        plan: From :func:`prepare_archive`.
        mirror: Commits each batch's new positions to the generation's consumer group.
        checkpoint: The query's checkpoint (scopes the batch ids of the generation's stats).
        tasks: How the source splits a batch into tasks: the driver plans the batches after
            a checkpoint's first one itself, from the offsets log. Needs ``checkpoint``.
    """

    def __init__(
        self,
        plan: ArchivePlan,
        mirror: ConsumerGroupMirror | None = None,
        checkpoint: str | Path | None = None,
        tasks: TaskPlan | None = None,
    ) -> None:
        self.plan = plan
        self.target = plan.target
        self.checkpoint = checkpoint
        self.tasks = tasks if checkpoint is not None else None
        self.mirror = mirror
        self.total = ArchiveOutcome()
        self.stats = BatchStatsRecorder(plan.target, checkpoint)

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """Archive one micro-batch; idempotent (a re-executed batch writes nothing new)."""
        started = time.perf_counter()
        planned = (
            None
            if self.tasks is None
            else planned_ranges(cast("str | Path", self.checkpoint), batch_id)
        )
        outcome = ArchiveOutcome()
        if planned is not None:
            for task_outcome in self._run_planned(df.sparkSession.sparkContext, planned, batch_id):
                outcome.merge(task_outcome)
        else:
            task = functools.partial(_archive_task, self.plan, batch_id)
            for row in df.mapInArrow(task, ARCHIVE_OUTCOME_SCHEMA).collect():
                outcome.merge(_OUTCOME_ROWS.of_row(row))
        self.total.merge(outcome)
        if self.mirror is not None:
            self.mirror.commit(outcome.positions)
        elapsed = time.perf_counter() - started
        if outcome.records:
            logger.info(
                "batch %d: %s in %.2fs (%.0f/s)",
                batch_id,
                outcome.describe(),
                elapsed,
                outcome.records / max(elapsed, 1e-9),
                extra={
                    "batch_id": batch_id,
                    "generation": self.target.generation,
                    "processor": self.target.processor,
                },
            )
            self.stats.record(batch_id, started)

    def _run_planned(
        self, sc: SparkContext, planned: list[Range], batch_id: int
    ) -> list[ArchiveOutcome]:
        """Run the batch's tasks as the driver planned them: one RDD job, a task per group."""
        if not planned:
            return []
        groups = tuple(cast("TaskPlan", self.tasks).groups(planned))
        task = functools.partial(_planned_archive_task, self.plan, batch_id, groups)
        return run_planned_tasks(sc, self.target, batch_id, len(planned), len(groups), task)


def start_archive_query(
    source: DataFrame,
    sink: ArchiveSink,
    query_name: str,
    checkpoint: str | Path,
    trigger_interval: str,
) -> StreamingQuery:
    """Wire the ranges source -> ``foreachBatch`` archive sink (no logic here)."""
    if "start_offset" not in source.columns:
        msg = f"{sink.target.processor}: the archive needs the refold_kafka_ranges source"
        raise ProcessorConfigError(msg)
    return (
        source.writeStream.foreachBatch(sink)
        .queryName(query_name)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=trigger_interval)
        .start()
    )
