"""``foreachBatch`` glue: run :class:`FoldWriter` inside Spark tasks, one pass per batch.

Read, decode, fold and the Redis write are fused in one task per group of Kafka partition
ranges (the fastest shape measured here, see DESIGN.md): every range of the micro-batch is
handled by exactly one task, which reports its counts back to the driver.

Behind refold's ranges source the driver plans the tasks itself, from the batch's entry in the
checkpoint's offsets log (the source's own grouping, :class:`TaskPlan`), and runs them as one
small RDD job. Spark still plans the batch's scan (the source's ``partitions()``), but no
``mapInArrow`` is planned over it and no task waits for range rows from another Python worker
(30-90 ms less a batch in the latency runs, docs/performance.md). A checkpoint's first batch,
whose start the log does not hold, and the other sources run ``mapInArrow`` over the source
DataFrame.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import pyarrow as pa
import pyarrow.compute as pc
import redis

from refold.contracts.codec import EventCodec
from refold.contracts.layout import position_field
from refold.contracts.store.connect import redis_client
from refold.processors.fold.projection import Projection
from refold.processors.fold.records import SourceRecord
from refold.processors.runtime.background import DriverTask
from refold.processors.runtime.batch_stats import BatchStatsRecorder
from refold.processors.runtime.code_identity import check_executor_code
from refold.processors.runtime.envelope import BatchOutcome, FoldTarget, FoldWriter
from refold.processors.runtime.group_mirror import ConsumerGroupMirror
from refold.processors.runtime.kafka_ranges import Range, SourceOptions, TaskPlan, read_messages
from refold.processors.runtime.offset_log import batch_ranges, planned_ranges
from refold.processors.runtime.outcome_rows import OutcomeRows

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import DataFrame

__all__ = [
    "OUTCOME_SCHEMA",
    "RedisFoldSink",
    "ranges_of",
    "records_of_ranges",
    "records_of_rows",
    "run_planned_tasks",
]

logger = logging.getLogger(__name__)

# A task's BatchOutcome crosses to the driver as one Arrow row (see OutcomeRows).
_OUTCOME_ROWS = OutcomeRows(BatchOutcome)
OUTCOME_SCHEMA = _OUTCOME_ROWS.ddl

# One FoldWriter per (target, processor) per Python worker: Spark reuses workers, so the Redis
# connection and the dead-letter producer survive from task to task.
_WRITERS: dict[tuple[FoldTarget, str, int | None], FoldWriter] = {}

# Records per FoldWriter.apply (one Redis transaction) inside a task: big enough that the
# per-transaction round trips do not matter, small enough that the next chunk arrives while
# this one folds.
_APPLY_CHUNK = 25_000


def _writer(
    target: FoldTarget, projection: Projection, codec: EventCodec, slot: int | None = None
) -> FoldWriter:
    check_executor_code(projection, target.code_fingerprint, target.declared_code)
    key = (target, projection.name, slot)
    writer = _WRITERS.get(key)
    if writer is None:
        writer = _WRITERS[key] = FoldWriter(target, projection, codec, slot=slot)
        writer.connect()
    writer.begin_task()
    return writer


_Outcome = TypeVar("_Outcome")


def run_planned_tasks(
    sc: SparkContext,
    target: FoldTarget,
    batch_id: int,
    ranges: int,
    tasks: int,
    task: Callable[[int, Iterable[int]], Iterable[_Outcome]],
) -> list[_Outcome]:
    """Run a batch's tasks as the driver planned them: one RDD job, ``task(index, _)`` each.

    Shared by the fold and archive sinks. ``ranges`` and ``tasks`` are counted for the DEBUG
    line that says the batch was planned from the offsets log.
    """
    logger.debug(
        "batch %d: %d ranges in %d tasks, planned from the offsets log",
        batch_id,
        ranges,
        tasks,
        extra={"batch_id": batch_id, "processor": target.processor},
    )
    return sc.parallelize(range(tasks), tasks).mapPartitionsWithIndex(task).collect()


def ranges_of(batches: Iterator[pa.RecordBatch]) -> tuple[Range, ...]:
    """The Kafka partition ranges of a ``refold_kafka_ranges`` task."""
    return tuple(
        (t, p, s, e)
        for batch in batches
        for t, p, s, e in zip(
            batch.column("topic").to_pylist(),
            batch.column("partition").to_pylist(),
            batch.column("start_offset").to_pylist(),
            batch.column("end_offset").to_pylist(),
            strict=True,
        )
    )


def records_of_ranges(
    target: FoldTarget, ranges: tuple[Range, ...]
) -> Iterator[list[SourceRecord]]:
    """Read the records of the task's ranges in this worker.

    Straight from confluent-kafka messages to :class:`SourceRecord`: no Arrow in between.
    """
    options = SourceOptions(
        kafka=target.kafka,
        topics=tuple(sorted({r[0] for r in ranges})),
        archive_root=target.archive_root,
    )
    for chunk in read_messages(options, ranges):
        yield [SourceRecord.of_message(m) for m in chunk]


def records_of_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[list[SourceRecord]]:
    """The records of Spark rows (``refold_kafka`` / ``kafka`` source columns)."""
    for batch in batches:
        # Timestamps as epoch-ms integers, converted by Arrow: as datetimes they cost ~2 us a row.
        micros = batch.column("timestamp").cast(pa.int64()).fill_null(0)
        yield list(
            map(
                SourceRecord,
                batch.column("topic").to_pylist(),
                batch.column("partition").to_pylist(),
                batch.column("offset").to_pylist(),
                batch.column("key").to_pylist(),
                batch.column("value").to_pylist(),
                pc.divide(micros, 1000).to_pylist(),
            )
        )


def _in_chunks(parts: Iterator[list[SourceRecord]]) -> Iterator[list[SourceRecord]]:
    """Regroup ``parts`` into lists of at least ``_APPLY_CHUNK`` records (the last: the rest)."""
    pending: list[SourceRecord] = []
    for part in parts:
        pending.extend(part)
        if len(pending) >= _APPLY_CHUNK:
            yield pending
            pending = []
    if pending:
        yield pending


def _fold_task(
    target: FoldTarget,
    projection: Projection,
    codec: EventCodec,
    batch_id: int,
    ranges_mode: bool,
    planned: Mapping[str, tuple[int, int]],
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """Executor side: read the task's records and apply them chunk by chunk; one outcome row.

    Each chunk is one guarded transaction (its partitions' positions move with it), so a
    retried task skips what an earlier attempt applied. Meanwhile the consumer keeps fetching
    the next records in the background: reading overlaps folding, as in the baseline.

    ``planned``: the batch's range per partition, for a records source whose tasks each read
    whole partition ranges (Spark's ``kafka``: one task per Kafka partition, as refold sets
    neither ``minPartitions`` nor ``maxRecordsPerPartition``); empty otherwise.
    """
    writer = _writer(target, projection, codec)  # first: it connects while the records come
    ranges = ranges_of(batches) if ranges_mode else ()
    parts = records_of_ranges(target, ranges) if ranges_mode else records_of_rows(batches)
    yield from _outcome_rows(_apply_all(writer, parts, ranges, batch_id, planned))


def _slot_task(
    target: FoldTarget,
    projection: Projection,
    codec: EventCodec,
    batch_id: int,
    ranges: tuple[Range, ...],
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """Executor side, re-keyed processors: one writer slot reads every range of the batch.

    It folds the records whose entity belongs to its slot (:mod:`refold.processors.fold.rekey`) and
    moves its slot's positions to the ranges' ends, in guarded transactions of its own.
    """
    slots = [s for batch in batches for s in batch.column("id").to_pylist()]
    for slot in slots:
        yield from _outcome_rows(_fold_ranges(target, projection, codec, batch_id, ranges, slot))


def _fold_ranges(
    target: FoldTarget,
    projection: Projection,
    codec: EventCodec,
    batch_id: int,
    ranges: tuple[Range, ...],
    slot: int | None,
) -> BatchOutcome:
    """Read ``ranges`` in this worker and fold them (as writer slot ``slot`` when re-keyed)."""
    writer = _writer(target, projection, codec, slot)
    return _apply_all(writer, records_of_ranges(target, ranges), ranges, batch_id)


def _planned_task(
    target: FoldTarget,
    projection: Projection,
    codec: EventCodec,
    batch_id: int,
    groups: tuple[tuple[Range, ...], ...],
    slotted: bool,
    index: int,
    _rows: Iterator[int],
) -> Iterator[BatchOutcome]:
    """Executor side, tasks planned by the driver: task ``index`` folds ``groups[index]``.

    Re-keyed (``slotted``): as writer slot ``index``, whose task reads every range of the batch.
    """
    slot = index if slotted else None
    outcome = _fold_ranges(target, projection, codec, batch_id, groups[index], slot)
    if outcome.records:
        yield outcome


def _apply_all(
    writer: FoldWriter,
    parts: Iterator[list[SourceRecord]],
    ranges: tuple[Range, ...],
    batch_id: int,
    planned: Mapping[str, tuple[int, int]] | None = None,
) -> BatchOutcome:
    """Apply ``parts`` chunk by chunk, then close each range at its end.

    ``ranges``: the ranges the task read itself; ``planned``: the batch's ranges, of which
    the task read those of the partitions its records came from.
    """
    outcome = BatchOutcome()
    for records in _in_chunks(parts):
        # No sort: the source hands each partition's records over in offset order.
        outcome.merge(writer.apply(records, batch_id))
    read = {position_field(t, p): (s, e) for t, p, s, e in ranges}
    read.update({f: planned[f] for f in outcome.positions if planned and f in planned})
    # Every range was read in full: its position reaches the range's end even where the last
    # offsets held no record (a transaction marker), so Redis never looks behind Spark's plan.
    short = {f: (s, e) for f, (s, e) in read.items() if outcome.positions.get(f, -1) < e}
    if short:
        closing = writer.apply([], batch_id, covered=short)
        outcome.positions.update(closing.positions)
    return outcome


def _outcome_rows(outcome: BatchOutcome) -> Iterator[pa.RecordBatch]:
    if outcome.records:
        yield from _OUTCOME_ROWS.rows(outcome)


def _outcome_of_row(row: Any) -> BatchOutcome:
    """The driver's side of :func:`_outcome_rows`: one task's outcome from its collected row."""
    return _OUTCOME_ROWS.of_row(row)


class RedisFoldSink:
    """The ``foreachBatch`` function of a processor query (driver side, picklable).

    Args:
        target: Where the generation lives.
        projection: The fold.
        mirror: Commits each batch's new positions to the generation's consumer group.
        closer: The driver task asked for a round after each batch (a window processor's
            closer, a lookup processor's joiner).
        codec: The contracts (default: the installed contract sets, loaded on the driver).
        checkpoint: The query's checkpoint (scopes the batch ids of the generation's stats).
        closes_ranges: The source hands over records (Spark's ``kafka``), and each batch's
            ranges are read from the checkpoint's offsets log so that every partition's
            position reaches its range's end, as with refold's ranges source.
        tasks: The source is refold's ranges source, which splits a batch into tasks so:
            the driver plans the batches after a checkpoint's first one itself (see the
            module's docstring). Needs ``checkpoint``.
    """

    def __init__(
        self,
        target: FoldTarget,
        projection: Projection,
        mirror: ConsumerGroupMirror | None = None,
        codec: EventCodec | None = None,
        closer: DriverTask | None = None,
        checkpoint: str | Path | None = None,
        closes_ranges: bool = False,
        tasks: TaskPlan | None = None,
    ) -> None:
        self.target = target
        self.checkpoint = checkpoint
        self.closes_ranges = closes_ranges and checkpoint is not None
        self.tasks = tasks if checkpoint is not None else None
        self.projection = projection
        self.mirror = mirror
        self.closer = closer
        # Built on the driver and shipped with every task: executors decode with the driver's
        # catalog, even where the user's contract package is only shipped as code (no
        # installed entry points there).
        self.codec = codec or EventCodec()
        self._redis: redis.Redis | None = None
        self.last_outcome = BatchOutcome()
        self.total = BatchOutcome()
        self.stats = BatchStatsRecorder(target, checkpoint)

    def _generation_positions(self, reported: dict[str, int]) -> dict[str, int]:
        """Re-keyed: the generation's positions (the slots' minimum), for the consumer group."""
        if not reported:
            return reported
        if self._redis is None:  # driver side; opened on the first batch
            self._redis = redis_client(self.target.redis_url)
        return self.target.positions(self._redis).read_fields(sorted(reported))

    def _close_unread(
        self, planned: Mapping[str, tuple[int, int]], outcome: BatchOutcome, batch_id: int
    ) -> None:
        """Close the batch's non-empty ranges no task had a record of (transaction markers).

        Driver side, rare. The envelope refolds a hole first if Redis lost writes below a
        range's start, so moving such a position to the range's end never skips a record.
        """
        seen = outcome.positions
        unread = {f: (s, e) for f, (s, e) in planned.items() if s < e and f not in seen}
        if not unread:
            return
        closing = _writer(self.target, self.projection, self.codec).apply(
            [], batch_id, covered=unread
        )
        outcome.merge(closing)

    def _run_planned(
        self, sc: SparkContext, planned: list[Range], batch_id: int
    ) -> list[BatchOutcome]:
        """Run the batch's tasks as the driver planned them: one RDD job, a task per group."""
        if not planned:
            return []
        slotted = bool(self.target.slots)
        if slotted:
            # Re-keyed: every writer slot's task reads every range of the batch.
            groups = (tuple(planned),) * self.target.slots
        else:
            groups = tuple(cast("TaskPlan", self.tasks).groups(planned))
        task = functools.partial(
            _planned_task, self.target, self.projection, self.codec, batch_id, groups, slotted
        )
        return run_planned_tasks(sc, self.target, batch_id, len(planned), len(groups), task)

    def _run_on_source(self, df: DataFrame, batch_id: int, outcome: BatchOutcome) -> None:
        """Run the batch's tasks over the source DataFrame (``mapInArrow``), merging outcomes."""
        ranges = "start_offset" in df.columns  # refold_kafka_ranges: the task reads the records
        batch_plan: dict[str, tuple[int, int]] = {}
        if self.target.slots:
            # Re-keyed: the batch's ranges (a few rows) go to every writer slot's task.
            planned = tuple(
                (r.topic, r.partition, r.start_offset, r.end_offset)
                for r in df.select("topic", "partition", "start_offset", "end_offset").collect()
            )
            slots = self.target.slots
            task = functools.partial(
                _slot_task, self.target, self.projection, self.codec, batch_id, planned
            )
            tasks = df.sparkSession.range(0, slots, 1, slots) if planned else None
        else:
            if self.closes_ranges:
                batch_plan = batch_ranges(cast("str", self.checkpoint), batch_id)
            task = functools.partial(
                _fold_task, self.target, self.projection, self.codec, batch_id, ranges, batch_plan
            )
            tasks = df
        rows = [] if tasks is None else tasks.mapInArrow(task, OUTCOME_SCHEMA).collect()
        for row in rows:
            outcome.merge(_outcome_of_row(row))
        if self.closes_ranges and not self.target.slots:
            self._close_unread(batch_plan, outcome, batch_id)

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """Apply one micro-batch; idempotent per batch (re-execution changes nothing)."""
        started = time.perf_counter()
        planned = (
            None
            if self.tasks is None
            else planned_ranges(cast("str | Path", self.checkpoint), batch_id)
        )
        outcome = BatchOutcome()
        if planned is not None:
            for task_outcome in self._run_planned(df.sparkSession.sparkContext, planned, batch_id):
                outcome.merge(task_outcome)
        else:
            self._run_on_source(df, batch_id, outcome)
        if self.target.slots:
            outcome.positions = self._generation_positions(outcome.positions)
        self.last_outcome = outcome
        self.total.merge(outcome)
        if self.mirror is not None:
            self.mirror.commit(outcome.positions)
        closed = 0 if self.closer is None else self.closer.request()
        elapsed = time.perf_counter() - started
        if outcome.records:
            logger.info(
                "batch %d: %d records, %d applied, %d skipped, %d of types it does not fold "
                "(passed by), %d rejected, %d undecodable, "
                "%d side effects (%d suppressed while replaying), %d late, %d re-sent by their "
                "upstream (skipped), %d expired (state TTL), %d windows closed "
                "in %.2fs (%.0f/s)",
                batch_id,
                outcome.records,
                outcome.applied,
                outcome.skipped,
                outcome.passed,
                outcome.rejected,
                outcome.undecodable,
                outcome.effects,
                outcome.suppressed,
                outcome.late,
                outcome.duplicates,
                outcome.expired,
                closed,
                elapsed,
                outcome.records / max(elapsed, 1e-9),
                extra={
                    "batch_id": batch_id,
                    "generation": self.target.generation,
                    "processor": self.target.processor,
                },
            )
            self.stats.record(batch_id, started)
