"""A Kafka streaming source for Spark, as a PySpark Python Data Source (format ``refold_kafka``).

Spark's own Kafka connector is a JVM jar that is not in the pyspark wheel; this source reads
Kafka with confluent-kafka instead. Its output columns and options follow Spark's ``kafka``
source, so a deployment with the jar can switch formats by configuration:

* columns: ``key, value, topic, partition, offset, timestamp, timestampType``;
* options: ``kafka.bootstrap.servers`` (and any ``kafka.*`` librdkafka property), ``subscribe``,
  ``startingOffsets`` (``earliest`` | ``latest`` | ``{"topic":{"0":23,"1":-2}}``, -2 earliest,
  -1 latest, missing partitions earliest), ``maxOffsetsPerTrigger``, ``failOnDataLoss``;
* refold additions: ``maxTasks`` (coalesce the batch's partition ranges into at most this many
  Spark tasks; on 2 cores fewer, larger tasks cut the per-batch cost),
  ``endingOffsets`` (Spark's batch option, here for a stream: per partition, the offset it stops
  before; the query then plans empty batches, and ``replay --until`` stops it there) and
  ``minRecordsPerTask`` (default 25000: a small batch gets fewer tasks, down to one, since every
  task costs a fixed Python worker round trip; this is what keeps latency low). Consumer-group
  offsets for lag tools are committed by the processor's sink, not here.

Offsets are ``{"topic": {"partition": next_offset}}`` with sorted keys (Spark compares the JSON).

Lifecycle: Spark builds the stream reader twice, in different processes. The driver copy answers
``initialOffset/latestOffset/partitions/commit/stop`` and keeps a :class:`LogOffsets` probe; a
pickled copy runs :meth:`KafkaStreamReader.read` in executors' Python workers, where consumers
are cached per process by :mod:`refold.processors.runtime.kafka_ranges` (workers are reused), never
created in ``__init__``. Planning and reading live there, without pyspark; this module is the
Spark wiring.
``read`` is idempotent: it returns exactly the records of ``[start, end)``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from refold.contracts.kafka.offsets import LogOffsets, OffsetsError, TopicPartitionKey
from refold.contracts.kafka.offsets_json import Offsets, flatten, nest
from refold.processors.runtime.kafka_ranges import (
    Range,
    SourceOptions,
    batch_ranges_between,
    cap_offsets,
    coalesce_ranges,
    read_messages,
    resolve_starting_offsets,
)

__all__ = [
    "SOURCE_SCHEMA",
    "KafkaDataSource",
    "KafkaRangePartition",
    "KafkaStreamReader",
    "SourceOptions",
    "cap_offsets",
    "coalesce_ranges",
]

logger = logging.getLogger(__name__)

SOURCE_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
_ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
    ]
)
# Rows per Arrow batch handed to Spark: large enough to amortise the per-batch cost.
_ARROW_ROWS = 10_000


@dataclass(frozen=True)
class KafkaRangePartition(InputPartition):
    """One Spark task: one or more Kafka partition ranges ``[start, end)``."""

    ranges: tuple[Range, ...]


class _Columns:
    """Column buffers for one Arrow record batch."""

    def __init__(self) -> None:
        self.key: list[bytes | None] = []
        self.value: list[bytes | None] = []
        self.topic: list[str] = []
        self.partition: list[int] = []
        self.offset: list[int] = []
        self.timestamp: list[int | None] = []
        self.timestamp_type: list[int] = []

    def __len__(self) -> int:
        return len(self.offset)

    def to_batch(self) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(
            [
                pa.array(self.key, pa.binary()),
                pa.array(self.value, pa.binary()),
                pa.array(self.topic, pa.string()),
                pa.array(self.partition, pa.int32()),
                pa.array(self.offset, pa.int64()),
                pa.array(self.timestamp, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                pa.array(self.timestamp_type, pa.int32()),
            ],
            schema=_ARROW_SCHEMA,
        )


def read_ranges(options: SourceOptions, ranges: tuple[Range, ...]) -> Iterator[pa.RecordBatch]:
    """Read exactly the records of ``ranges`` as Arrow batches (executor side).

    Raises:
        RuntimeError: See :func:`read_messages`.
    """
    columns = _Columns()
    for chunk in read_messages(options, ranges):
        for message in chunk:
            ts_type, ts_ms = message.timestamp()
            columns.key.append(message.key())
            columns.value.append(message.value())
            columns.topic.append(message.topic() or "")
            columns.partition.append(message.partition() or 0)
            columns.offset.append(int(message.offset() or 0))
            columns.timestamp.append(ts_ms * 1000 if ts_ms >= 0 else None)
            columns.timestamp_type.append(ts_type)
            if len(columns) >= _ARROW_ROWS:
                yield columns.to_batch()
                columns = _Columns()
    if len(columns):
        yield columns.to_batch()


class KafkaStreamReader(DataSourceStreamReader):
    """Micro-batch reader over Kafka partitions (see the module docstring for the lifecycle)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._probe: LogOffsets | None = None
        # The end of the last planned batch: the base of maxOffsetsPerTrigger. Spark calls a
        # fresh query latestOffset() *before* initialOffset(), and a restarted query
        # partitions(o, o) with its checkpointed offset first (PySpark 4.1, observed).
        self._last_end: dict[TopicPartitionKey, int] | None = None
        self._initial: Offsets | None = None
        self._unreachable_since: float | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors get the options only; clients are never pickled.
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    @property
    def probe(self) -> LogOffsets:
        """Driver-side offsets probe (created on first use)."""
        if self._probe is None:
            self._probe = LogOffsets(dict(self.options.kafka))
        return self._probe

    def _partitions(self) -> list[TopicPartitionKey]:
        return [(t, p) for t in self.options.topics for p in self.probe.partitions(t)]

    def initialOffset(self) -> Offsets:  # noqa: N802 - Spark's method name
        """Resolve ``startingOffsets`` against the log (driver; resolved once)."""
        if self._initial is not None:
            return self._initial
        resolved = resolve_starting_offsets(
            self.probe,
            self.options.topics,
            self.options.starting_offsets,
            fail_on_data_loss=self.options.fail_on_data_loss,
            archive_root=self.options.archive_root,
        )
        if self._last_end is None:
            self._last_end = dict(resolved)
        self._initial = nest(resolved)
        return self._initial

    def latestOffset(self) -> Offsets:  # noqa: N802 - Spark's method name
        """The log end, capped by ``maxOffsetsPerTrigger`` (driver; called every trigger)."""
        if self._last_end is None:
            self.initialOffset()  # a fresh query: its first batch starts there
        assert self._last_end is not None  # noqa: S101 - set by initialOffset
        # One ListOffsets per trigger: the high watermark of every partition.
        try:
            ends = self.probe.end_offsets(self._partitions())
        except OffsetsError as exc:
            # Broker unreachable: plan nothing new and ask again next trigger. Failing here
            # would stop the query; waiting is what a Kafka consumer does too.
            self._warn_unreachable(exc)
            return nest(self._last_end)
        self._unreachable_since = None
        # Never behind what was already planned: an end offset only moves forward.
        ends = {tp: max(e, self._last_end.get(tp, 0)) for tp, e in ends.items()}
        ends = self.options.bounded(ends)  # endingOffsets: a state as of a moment stops there
        if self.options.max_offsets_per_trigger:
            ends = cap_offsets(self._last_end, ends, self.options.max_offsets_per_trigger)
        self._last_end = dict(ends)
        return nest(ends)

    def _warn_unreachable(self, exc: OffsetsError) -> None:
        now = time.monotonic()
        if self._unreachable_since is None:
            self._unreachable_since = now
            logger.warning("cannot read the log end; waiting for the broker: %s", exc)
        else:
            logger.info(
                "broker still unreachable after %.0fs: %s", now - self._unreachable_since, exc
            )

    def partitions(self, start: Offsets, end: Offsets) -> list[KafkaRangePartition]:
        """Split ``[start, end)`` into tasks (driver)."""
        begin, finish = flatten(start), flatten(end)
        if self._last_end is None:
            # A restarted query plans its checkpointed batch first: seed the rate limit there.
            self._last_end = dict(finish)
        else:
            self._last_end = {tp: max(o, self._last_end.get(tp, 0)) for tp, o in finish.items()}
        ranges = batch_ranges_between(begin, finish)
        return [KafkaRangePartition(group) for group in self.options.tasks.groups(ranges)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Read one task's ranges (executor)."""
        assert isinstance(partition, KafkaRangePartition)  # noqa: S101 - Spark hands ours back
        return read_ranges(self.options, partition.ranges)

    def stop(self) -> None:
        """Close the driver's clients."""
        if self._probe is not None:
            self._probe.close()
            self._probe = None


RANGES_SCHEMA = "topic string, partition int, start_offset long, end_offset long"
_RANGES_ARROW = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("start_offset", pa.int64()),
        ("end_offset", pa.int64()),
    ]
)


class KafkaRangesStreamReader(KafkaStreamReader):
    """Same offsets and planning; ``read`` yields the task's ranges instead of their records.

    For a sink that reads the records itself, in the same Python worker that folds them (see
    :func:`read_ranges`): the records then never cross from a Python worker to the JVM and back.
    """

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """One row per Kafka partition range of the task (executor)."""
        assert isinstance(partition, KafkaRangePartition)  # noqa: S101 - Spark hands ours back
        ranges = partition.ranges
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([r[0] for r in ranges], pa.string()),
                pa.array([r[1] for r in ranges], pa.int32()),
                pa.array([r[2] for r in ranges], pa.int64()),
                pa.array([r[3] for r in ranges], pa.int64()),
            ],
            schema=_RANGES_ARROW,
        )


class KafkaRangesDataSource(DataSource):
    """``format("refold_kafka_ranges")``: micro-batches of offset ranges, not of records."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "refold_kafka_ranges"

    def schema(self) -> str:
        """One row per Kafka partition range ``[start_offset, end_offset)``."""
        return RANGES_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        """The micro-batch reader."""
        return KafkaRangesStreamReader(SourceOptions.parse(self.options))


class KafkaDataSource(DataSource):
    """``spark.readStream.format("refold_kafka")``: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "refold_kafka"

    def schema(self) -> str:
        """Same columns as Spark's Kafka source (without headers)."""
        return SOURCE_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        """The micro-batch reader."""
        return KafkaStreamReader(SourceOptions.parse(self.options))
