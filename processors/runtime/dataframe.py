"""Spark wiring of DataFrame processors: decode, the user's transform, the exactly-once upsert.

The protocol is :mod:`refold.processors.fold.dataframe`. A DataFrame processor's query is::

    source (refold_kafka_ranges | refold_kafka | kafka)
      -> mapInArrow: read the task's records, decode its event types into typed columns
         (executors; undecodable records go to the dead-letter topic, other types are passed by)
      -> processor.transform(events)          (Spark's own operators: watermark, window, join)
      -> select(key, to_json(struct(values)))
      -> writeStream.outputMode(update | append).foreachBatch(DataFrameSink)

:class:`DataFrameSink` runs on the driver: it collects the batch's rows and writes them, with
the source offsets the batch reached (read from the checkpoint's offsets log, which Spark
writes before it runs the batch) and the batch id, in ONE Redis ``MULTI/EXEC`` guarded by
``WATCH`` on the generation's positions (:mod:`.watched_commit`); a batch id at or below the
stored one changes nothing (:class:`TableUpsert`). The rows of a batch are collected to the
driver, which suits aggregates (a batch's rows are the groups it changed); a transform that
emits a row per event at high rates is better written as a fold.

Dead letters once: the decode task decides its letters as every engine does
(:func:`~refold.processors.runtime.dead_letter_index.decide_letters`: a generation being rebuilt
does not send a letter the live generation sent for the same record and reason) and writes the
entries to the generation's dead-letter index once they are acknowledged. That is not the
positions' transaction (the driver moves them, and never sees the letters), but it comes
before it: every record the positions pass has its entry, and an entry past the positions (a
batch that failed after its decode) is one a rebuild ignores and the re-run writes again.

The aggregation state lives in the Spark checkpoint, so the runner refuses to continue a
generation whose checkpoint is gone once it has applied a batch (:func:`refuse_lost_checkpoint`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa
import redis
from confluent_kafka import Producer
from redis.typing import EncodableT, FieldT

from refold.contracts.codec import EventCodec, writer_key
from refold.contracts.errors import DeserializationError
from refold.contracts.kafka.outputs import output_producer
from refold.contracts.layout import BATCH_ID_FIELD
from refold.contracts.store.connect import redis_client
from refold.contracts.store.outage import RedisOutage
from refold.contracts.store.stats import count_outcome
from refold.contracts.watermarks import is_marker
from refold.processors.errors import (
    REDIS_UNAVAILABLE,
    ProcessorConfigError,
    StateStoreUnavailableError,
)
from refold.processors.fold.dataframe import (
    DataFrameProcessor,
    EventColumn,
    EventColumnsError,
    event_columns,
    event_row,
    events_ddl,
    output_mode_of,
)
from refold.processors.runtime.batch_stats import BatchStatsRecorder
from refold.processors.runtime.dead_letter_index import send_once
from refold.processors.runtime.dead_letters import DeadLetter
from refold.processors.runtime.envelope import FoldTarget
from refold.processors.runtime.group_mirror import ConsumerGroupMirror
from refold.processors.runtime.offset_log import batch_end_offsets
from refold.processors.runtime.sink import ranges_of, records_of_ranges, records_of_rows
from refold.processors.runtime.watched_commit import commit_watched

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming.query import StreamingQuery
    from redis.client import Pipeline

__all__ = [
    "DataFrameSink",
    "DecodePlan",
    "SinkTotals",
    "TableUpsert",
    "build_dataframe_query",
    "decode_events",
    "redis_behind_message",
    "refuse_lost_checkpoint",
]

logger = logging.getLogger(__name__)

# Rows per Arrow batch handed from the decode task to Spark: large enough to amortise the
# per-batch cost, small enough to keep a task's memory flat.
_ARROW_ROWS = 10_000
# The rows' values as JSON, in UTC whatever the JVM's time zone: readers get the same text
# from every host, and a replay writes byte-identical values.
_JSON_OPTIONS = {"timeZone": "UTC", "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"}


# -- decoding (executors) -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DecodePlan:
    """What a decode task needs: built on the driver, pickled into every task.

    Attributes:
        target: The generation (Kafka settings for reads and dead letters, its name).
        codec: The driver's contracts (executors decode with the driver's catalog).
        event_types: The types decoded; the others are passed by undecoded.
        columns: The events DataFrame's columns.
        arrow: Their Arrow schema, exactly as Spark expects it.
    """

    target: FoldTarget
    codec: EventCodec
    event_types: tuple[str, ...]
    columns: tuple[EventColumn, ...]
    arrow: pa.Schema


# Per Python worker (Spark reuses them): the dead-letter producer, the Redis client of the
# dead-letter index, and per plan which writer fingerprints are decoded.
_PRODUCERS: dict[tuple[tuple[str, str], ...], Producer] = {}
_REDIS: dict[str, redis.Redis] = {}
_WANTED: dict[tuple[str, int, bytes], bool] = {}


def _producer(kafka: tuple[tuple[str, str], ...]) -> Producer:
    producer = _PRODUCERS.get(kafka)
    if producer is None:
        producer = _PRODUCERS[kafka] = output_producer(dict(kafka))
    return producer


def _send_once(target: FoldTarget, dead: list[DeadLetter]) -> None:
    """Send the letters this generation decides to send; then record them all in its index."""
    client = _REDIS.get(target.redis_url)
    if client is None:
        client = _REDIS[target.redis_url] = redis_client(target.redis_url)
    decision = send_once(client, _producer(target.kafka), target, dead)
    index: dict[FieldT, EncodableT] = dict(decision.entries.items())
    client.hset(target.keys.dead_letters, mapping=index)


def _wanted(plan: DecodePlan, value: bytes | None) -> bool:
    """Whether to decode a record: one of the plan's types, or not decodable (say why).

    Read off the record's header (single-object or registry framing), so records of other
    types are never decoded.
    """
    header = writer_key(value)
    if header is None:
        return True
    key = (plan.target.processor, plan.target.generation, header)
    wanted = _WANTED.get(key)
    if wanted is None:
        writer = plan.codec.writer_of(value)
        if writer is None:
            return True
        wanted = _WANTED[key] = writer.name in plan.event_types
    return wanted


def _decode_task(
    plan: DecodePlan, ranges_mode: bool, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` (executor side): the task's records as rows of the events DataFrame.

    Idempotent: a re-run task reads the same ranges and yields the same rows (its dead letters
    are written again: at least once, with their origin in the headers; a rebuild skips those
    the live generation sent, see the module docstring).
    """
    ranges = ranges_of(batches) if ranges_mode else ()
    parts = records_of_ranges(plan.target, ranges) if ranges_mode else records_of_rows(batches)
    dead: list[DeadLetter] = []
    rows: list[dict[str, Any]] = []
    for part in parts:
        for record in part:
            if is_marker(record.headers) or not _wanted(plan, record.value):
                continue  # a watermark marker (output streams) is no event
            try:
                event = plan.codec.decode(record.value)
            except DeserializationError as exc:
                dead.append(DeadLetter(record, exc.reason, str(exc)))
                continue
            if event.event_type not in plan.event_types:  # the header could not tell
                continue
            origin = (record.topic, record.partition, record.offset)
            rows.append(event_row(plan.columns, event.event_type, event.data, origin))
            if len(rows) >= _ARROW_ROWS:
                yield pa.RecordBatch.from_pylist(rows, schema=plan.arrow)
                rows = []
    if dead:  # acknowledged before the rows go on (the batch fails and runs again if not)
        _send_once(plan.target, dead)
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=plan.arrow)


def decode_events(
    source: DataFrame, processor: DataFrameProcessor, target: FoldTarget, codec: EventCodec
) -> DataFrame:
    """The streaming DataFrame of the processor's decoded events (driver: builds the plan).

    Args:
        source: The source stream: offset ranges (``refold_kafka_ranges``: each task reads
            its records) or records (``refold_kafka``, ``kafka``: a ``value`` column).
        processor: Its event types name the columns.
        target: The generation (Kafka settings, dead-letter topic).
        codec: The contracts; its reader schemas give the columns' types.

    Raises:
        ProcessorConfigError: The event types do not make one typed row.
    """
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import DataType, StructType

    try:
        columns = event_columns([codec.reader_for(t).raw for t in processor.event_types])
    except EventColumnsError as exc:
        msg = f"{processor.name}: {exc}"
        raise ProcessorConfigError(msg) from exc
    schema = cast("StructType", DataType.fromDDL(events_ddl(columns)))
    plan = DecodePlan(target, codec, tuple(processor.event_types), columns, to_arrow_schema(schema))
    ranges_mode = "start_offset" in source.columns
    return source.mapInArrow(functools.partial(_decode_task, plan, ranges_mode), schema)


# -- the sink (driver) ----------------------------------------------------------------------


class TableUpsert:
    """Upsert one batch's rows and its positions in one guarded transaction (driver side).

    Args:
        target: The generation.
        table: The table the rows go to (``t:<table>:<key>``).
    """

    def __init__(self, target: FoldTarget, table: str) -> None:
        self.target = target
        self.table = table
        self._redis: redis.Redis | None = None

    @property
    def redis(self) -> redis.Redis:
        """The Redis client (created on first use)."""
        if self._redis is None:
            self._redis = redis_client(self.target.redis_url)
        return self._redis

    def write(
        self, rows: Sequence[tuple[str, str]], positions: Mapping[str, int], batch_id: int
    ) -> int | None:
        """Apply batch ``batch_id`` once: its rows, positions and batch id, or nothing.

        Args:
            rows: ``(key, value JSON)``; a later row of the same key wins.
            positions: Where the batch ends (position fields -> next offset).
            batch_id: Spark's batch id (increasing within a checkpoint).

        Returns:
            How many offsets the batch moved the positions past (the records it read, on
            partitions that had a position), or None when the generation had applied this
            batch (or a later one) already.

        Raises:
            SinkConflictError: Another writer kept changing the positions.
            StateStoreUnavailableError: Redis stayed unreachable for 10 minutes.
        """
        outage: RedisOutage | None = None
        while True:
            try:
                written = self._write_once(rows, positions, batch_id)
            except REDIS_UNAVAILABLE as exc:
                outage = outage or RedisOutage(
                    f"the processor {self.target.processor}",
                    self.redis,
                    lambda waited, last: StateStoreUnavailableError(
                        f"Redis unreachable for {waited:.0f}s writing batch {batch_id} of "
                        f"{self.target.processor} g{self.target.generation}: {last}"
                    ),
                )
                outage.wait(exc)
                self._redis = None  # a new connection for the next attempt
            else:
                if outage is not None:
                    outage.over()
                return written

    def _write_once(
        self, rows: Sequence[tuple[str, str]], positions: Mapping[str, int], batch_id: int
    ) -> int | None:
        keys = self.target.keys
        moved = self.target.positions(self.redis)

        def attempt(pipe: Pipeline) -> int | None:
            before = moved.read_fields([BATCH_ID_FIELD, *sorted(positions)], via=pipe)
            stored = before.pop(BATCH_ID_FIELD, None)
            if stored is not None and stored >= batch_id:
                return None
            applied = sum(max(0, positions[f] - old) for f, old in before.items())
            pipe.multi()
            for key, value in rows:
                pipe.set(keys.table(self.table, key), value)
            pipe.hset(
                moved.writer_key(), mapping={**dict(positions.items()), BATCH_ID_FIELD: batch_id}
            )
            count_outcome(pipe, keys.stats, events=applied)
            pipe.execute()
            return applied

        return commit_watched(
            self.redis,
            moved.watch_keys(),
            attempt,
            f"{self.target.processor} g{self.target.generation}",
            {"batch_id": batch_id},
        )


@dataclass(slots=True)
class SinkTotals:
    """What a :class:`DataFrameSink` did since it started."""

    batches: int = 0
    rows: int = 0
    skipped_batches: int = 0
    no_key: int = 0

    def describe(self) -> str:
        """One line for the log."""
        return (
            f"{self.batches} batches, {self.rows} rows upserted, {self.skipped_batches} batches "
            f"already applied, {self.no_key} rows without a key"
        )


class DataFrameSink:
    """The ``foreachBatch`` function of a DataFrame processor's query (driver side).

    Args:
        target: The generation.
        table: The processor's table.
        checkpoint: The query's checkpoint (its offsets log says where each batch ends).
        mirror: Commits each batch's positions to the generation's consumer group.
    """

    def __init__(
        self,
        target: FoldTarget,
        table: str,
        checkpoint: str | Path,
        mirror: ConsumerGroupMirror | None = None,
    ) -> None:
        self.target = target
        self.checkpoint = checkpoint
        self.mirror = mirror
        self.upsert = TableUpsert(target, table)
        self.total = SinkTotals()
        self.stats = BatchStatsRecorder(target, checkpoint)

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """Apply one micro-batch; idempotent per batch id."""
        started = time.perf_counter()
        collected = df.collect()
        rows = [(str(r[0]), str(r[1])) for r in collected if r[0] is not None]
        missing = len(collected) - len(rows)
        positions = batch_end_offsets(self.checkpoint, batch_id)
        applied = self.upsert.write(rows, positions, batch_id)
        self.total.batches += 1
        if applied is None:
            self.total.skipped_batches += 1
            logger.info("batch %d: applied before; nothing written", batch_id)
            return
        self.total.rows += len(rows)
        self.total.no_key += missing
        if missing:
            logger.warning("batch %d: %d rows without a key were not written", batch_id, missing)
        if self.mirror is not None:
            self.mirror.commit(positions)
        if rows:
            logger.info(
                "batch %d: %d rows upserted into %s in %.2fs",
                batch_id,
                len(rows),
                self.upsert.table,
                time.perf_counter() - started,
                extra={
                    "batch_id": batch_id,
                    "generation": self.target.generation,
                    "processor": self.target.processor,
                },
            )
        if applied or rows:  # not Spark's no-data batches (a watermark's state eviction)
            # Its records were counted in the upsert's transaction; its dead letters are not
            # counted (the decode tasks report nothing back).
            self.stats.record(batch_id, started)


# -- the query and the runner's checks (driver) --------------------------------------------


def build_dataframe_query(
    source: DataFrame,
    processor: DataFrameProcessor,
    sink: DataFrameSink,
    query_name: str,
    trigger_interval: str,
    codec: EventCodec | None = None,
) -> StreamingQuery:
    """Wire source -> decode -> ``transform`` -> JSON rows -> ``foreachBatch`` (no logic here).

    Args:
        source: The source stream (see :func:`decode_events`).
        processor: The processor.
        sink: Its sink (which knows the checkpoint).
        query_name: Spark's query name.
        trigger_interval: The processing-time trigger.
        codec: The contracts (default: the installed contract sets, loaded on the driver and
            shipped with the decode tasks).

    Raises:
        ProcessorConfigError: The transform's result has no string ``key`` column, or the
            processor's output mode or event types are invalid.
    """
    from pyspark.sql import functions as F  # noqa: N812 - Spark's convention
    from pyspark.sql.types import StringType

    try:
        mode = output_mode_of(processor)
    except EventColumnsError as exc:
        raise ProcessorConfigError(str(exc)) from exc
    events = decode_events(source, processor, sink.target, codec or EventCodec())
    rows = processor.transform(events)
    fields = {f.name: f.dataType for f in rows.schema.fields}
    if not isinstance(fields.get("key"), StringType) or len(fields) < 2:
        msg = (
            f"{processor.name}: transform() must return a string `key` column and value "
            f"columns; it returns {rows.schema.simpleString()}"
        )
        raise ProcessorConfigError(msg)
    values = [F.col(f"`{name}`") for name in fields if name != "key"]
    out = rows.select(F.col("key"), F.to_json(F.struct(*values), _JSON_OPTIONS).alias("value"))
    # A processing-time trigger, as every processor (see engines.fold.build_query); available_now is
    # the runner's catch-up check.
    return (
        out.writeStream.outputMode(mode)
        .foreachBatch(sink)
        .queryName(query_name)
        .option("checkpointLocation", str(sink.checkpoint))
        .trigger(processingTime=trigger_interval)
        .start()
    )


def refuse_lost_checkpoint(
    name: str, generation: int, has_checkpoint: bool, batch_id: int | None
) -> None:
    """Refuse to continue a generation whose Spark state is gone.

    A DataFrame processor's aggregation state is in its checkpoint: started without it while
    Redis says batches were applied (the checkpoint was deleted, or the generation was seeded
    from a snapshot), it would rebuild its windows from the resumed offsets only and overwrite
    complete rows with partial ones.

    Raises:
        ProcessorConfigError: With the operator action.
    """
    if has_checkpoint or batch_id is None:
        return
    msg = (
        f"{name} g{generation} has applied batches but its Spark checkpoint is gone (or it was "
        "seeded from a snapshot): a DataFrame processor's state (open windows, join buffers) "
        "lives in the checkpoint, so it cannot resume from its Redis positions. Operator "
        f"action: rebuild it with `replay --processor {name} --to-earliest --execute`."
    )
    raise ProcessorConfigError(msg)


def redis_behind_message(name: str, generation: int) -> str:
    """Why a DataFrame processor stops when Redis lost writes Spark's checkpoint has passed."""
    return (
        f"{name} g{generation}: Redis has applied less than Spark's checkpoint says (Redis lost "
        "writes: failover, restore, lost fsync). Spark's state has moved past the lost batches "
        "and does not emit their rows again, so a DataFrame processor cannot repair it. Operator "
        f"action: rebuild it with `replay --processor {name} --to-earliest --execute`."
    )
