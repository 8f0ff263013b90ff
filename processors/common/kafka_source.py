"""A Kafka streaming source for Spark, as a PySpark Python Data Source (format ``refold_kafka``).

Spark's own Kafka connector is a JVM jar that is not in the pyspark wheel; this source reads
Kafka with confluent-kafka instead. Its output columns and options follow Spark's ``kafka``
source, so a deployment with the jar can switch formats by configuration:

* columns: ``key, value, topic, partition, offset, timestamp, timestampType``;
* options: ``kafka.bootstrap.servers`` (and any ``kafka.*`` librdkafka property), ``subscribe``,
  ``startingOffsets`` (``earliest`` | ``latest`` | ``{"topic":{"0":23,"1":-2}}``, -2 earliest,
  -1 latest, missing partitions earliest), ``maxOffsetsPerTrigger``, ``failOnDataLoss``;
* refold additions: ``maxTasks`` (coalesce the batch's partition ranges into at most this many
  Spark tasks; on 2 cores fewer, larger tasks cut the per-batch cost) and
  ``minRecordsPerTask`` (default 25000: a small batch gets fewer tasks, down to one, since every
  task costs a fixed Python worker round trip; this is what keeps latency low). Consumer-group
  offsets for lag tools are committed by the processor's sink, not here.

Offsets are ``{"topic": {"partition": next_offset}}`` with sorted keys (Spark compares the JSON).

Lifecycle: Spark builds the stream reader twice, in different processes. The driver copy answers
``initialOffset/latestOffset/partitions/commit/stop`` and keeps a :class:`LogOffsets` probe; a
pickled copy runs :meth:`KafkaStreamReader.read` in executors' Python workers, where consumers
are cached per process in this module (workers are reused), never created in ``__init__``.
``read`` is idempotent: it returns exactly the records of ``[start, end)``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from contracts.offsets import LogOffsets, TopicPartitionKey

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
# Most records per consume() call in read(). consume(n, timeout) returns only when it has n
# messages or the timeout passed, so read() never asks for more than its ranges still hold:
# otherwise the last call of every task would wait out the whole timeout (0.5 s per batch).
_CONSUME_BATCH = 10_000
_EARLIEST, _LATEST = -2, -1

Offsets = dict[str, dict[str, int]]
Range = tuple[str, int, int, int]  # topic, partition, start (inclusive), end (exclusive)


def _as_bool(value: str | None, default: bool) -> bool:
    if value is None:
        return default
    return value.strip().lower() in ("true", "1", "yes")


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """The source's options, parsed once (picklable)."""

    kafka: tuple[tuple[str, str], ...]
    topics: tuple[str, ...]
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    max_tasks: int | None = None
    min_records_per_task: int = 25_000
    poll_timeout_s: float = 120.0

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Read Spark's option map (keys are case-insensitive there).

        Raises:
            ValueError: Missing ``subscribe`` or ``kafka.bootstrap.servers``, or a bad number.
        """
        lowered = {k.lower(): v for k, v in options.items()}
        kafka = tuple(
            sorted(
                (k[len("kafka.") :], v)
                for k, v in options.items()
                if k.lower().startswith("kafka.")
            )
        )
        if not any(k == "bootstrap.servers" for k, _ in kafka):
            msg = "refold_kafka: option kafka.bootstrap.servers is required"
            raise ValueError(msg)
        topics = tuple(t.strip() for t in lowered.get("subscribe", "").split(",") if t.strip())
        if not topics:
            msg = "refold_kafka: option subscribe (comma-separated topics) is required"
            raise ValueError(msg)
        limit = lowered.get("maxoffsetspertrigger")
        tasks = lowered.get("maxtasks")
        min_per_task = lowered.get("minrecordspertask")
        return cls(
            kafka=kafka,
            topics=topics,
            starting_offsets=lowered.get("startingoffsets", "earliest").strip(),
            max_offsets_per_trigger=int(limit) if limit else None,
            fail_on_data_loss=_as_bool(lowered.get("failondataloss"), True),
            max_tasks=int(tasks) if tasks else None,
            min_records_per_task=int(min_per_task) if min_per_task else 25_000,
            poll_timeout_s=float(lowered.get("kafkaconsumer.polltimeoutms", "120000")) / 1000,
        )


@dataclass(frozen=True)
class KafkaRangePartition(InputPartition):
    """One Spark task: one or more Kafka partition ranges ``[start, end)``."""

    ranges: tuple[Range, ...]


def _flatten(offsets: Offsets) -> dict[TopicPartitionKey, int]:
    return {(t, int(p)): int(o) for t, parts in offsets.items() for p, o in parts.items()}


def _nest(flat: Mapping[TopicPartitionKey, int]) -> Offsets:
    nested: Offsets = {}
    for (topic, partition), offset in sorted(flat.items()):
        nested.setdefault(topic, {})[str(partition)] = int(offset)
    return {
        t: dict(sorted(p.items(), key=lambda kv: int(kv[0]))) for t, p in sorted(nested.items())
    }


def cap_offsets(
    start: Mapping[TopicPartitionKey, int], end: Mapping[TopicPartitionKey, int], limit: int
) -> dict[TopicPartitionKey, int]:
    """Cap ``end`` so at most ``limit`` records lie between ``start`` and it.

    The limit is shared across partitions in proportion to their backlog, as Spark's Kafka
    source does; the rounding remainder goes to the largest backlogs, so a non-empty backlog
    always moves forward.
    """
    backlog = {tp: max(0, e - start.get(tp, e)) for tp, e in end.items()}
    total = sum(backlog.values())
    if total <= limit:
        return dict(end)
    shares = {tp: limit * size // total for tp, size in backlog.items()}
    left = limit - sum(shares.values())
    for tp in sorted(backlog, key=lambda t: (-(limit * backlog[t] % total), t)):
        if left <= 0:
            break
        if shares[tp] < backlog[tp]:
            shares[tp] += 1
            left -= 1
    return {tp: start.get(tp, e) + shares[tp] if tp in start else e for tp, e in end.items()}


def coalesce_ranges(
    ranges: list[Range], max_tasks: int | None, min_records_per_task: int = 0
) -> list[tuple[Range, ...]]:
    """Group partition ranges into at most ``max_tasks`` tasks of similar record counts.

    Each Kafka partition range stays whole in one task (its keys are folded by one writer).
    With ``min_records_per_task``, a small batch gets fewer tasks (at least one): each task has
    a fixed cost, so splitting a few thousand records only adds latency.
    """
    if not ranges:
        return []
    if min_records_per_task > 0:
        records = sum(r[3] - r[2] for r in ranges)
        by_size = max(1, records // min_records_per_task)
        max_tasks = by_size if max_tasks is None else min(max_tasks, by_size)
    if max_tasks is None or max_tasks >= len(ranges):
        return [(r,) for r in ranges]
    bins: list[list[Range]] = [[] for _ in range(max(1, max_tasks))]
    sizes = [0] * len(bins)
    for rng in sorted(ranges, key=lambda r: (-(r[3] - r[2]), r[0], r[1])):
        lightest = sizes.index(min(sizes))
        bins[lightest].append(rng)
        sizes[lightest] += rng[3] - rng[2]
    return [tuple(sorted(b)) for b in bins if b]


# Executor side: one consumer per (Kafka config) per Python worker process.
_CONSUMERS: dict[tuple[tuple[str, str], ...], Consumer] = {}


def _consumer(kafka: tuple[tuple[str, str], ...]) -> Consumer:
    consumer = _CONSUMERS.get(kafka)
    if consumer is None:
        config: dict[str, Any] = {
            "group.id": "refold-source",  # required by librdkafka; never joined or committed
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,  # tells a range that ends at the log end it is done
            "allow.auto.create.topics": False,  # Tansu would create unknown topics
            "auto.offset.reset": "earliest",  # a start below the log start is checked below
            "fetch.queue.backoff.ms": 10,  # the 1 s default throttles bulk reads ~8x
            # Ranges end at or near the log end, where a fetch waits up to this long for more
            # data; one fetch per broker is in flight, so the other partitions wait behind it.
            # 10 ms instead of 100 took reading 3k records over 8 partitions from ~50 to ~10 ms.
            "fetch.wait.max.ms": 10,
            **dict(kafka),
        }
        consumer = _CONSUMERS[kafka] = Consumer(config)
    return consumer


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


def read_messages(options: SourceOptions, ranges: tuple[Range, ...]) -> Iterator[list[Message]]:
    """Read exactly the records of ``ranges``, in chunks of confluent-kafka messages (executor).

    Every message yielded is a record of a range, in offset order per partition.

    Raises:
        RuntimeError: Records below a range's start are gone (with ``failOnDataLoss``), a
            broker error, or no progress within the poll timeout (Spark retries the task).
    """
    todo = {(t, p): (s, e) for t, p, s, e in ranges if e > s}
    if not todo:
        return
    consumer = _consumer(options.kafka)
    consumer.assign([TopicPartition(t, p, s) for (t, p), (s, _e) in todo.items()])
    next_offset = {tp: s for tp, (s, _e) in todo.items()}
    deadline = time.monotonic() + options.poll_timeout_s
    try:
        while todo:
            remaining = sum(e - next_offset[tp] for tp, (_s, e) in todo.items())
            messages = consumer.consume(max(1, min(_CONSUME_BATCH, remaining)), timeout=0.5)
            if not messages and time.monotonic() > deadline:
                msg = (
                    f"refold_kafka: no records for {sorted(todo)} within "
                    f"{options.poll_timeout_s:.0f}s (expected up to {dict(todo)})"
                )
                raise RuntimeError(msg)
            chunk = []
            for message in messages:
                tp = (message.topic() or "", message.partition() or 0)
                if tp not in todo:
                    continue
                start, end = todo[tp]
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:  # noqa: SLF001 - librdkafka's public name
                        if int(message.offset() or 0) >= end:
                            _finish(consumer, todo, tp)
                        continue
                    msg = f"refold_kafka: reading {tp[0]}/{tp[1]} failed: {error.str()}"
                    raise RuntimeError(msg)
                offset = int(message.offset() or 0)
                if offset >= end:
                    _finish(consumer, todo, tp)
                    continue
                if offset > next_offset[tp] and next_offset[tp] == start:
                    _on_gap(options, tp, start, offset)
                next_offset[tp] = offset + 1
                chunk.append(message)
                if offset + 1 >= end:
                    _finish(consumer, todo, tp)
            if chunk:
                yield chunk
            if messages:
                deadline = time.monotonic() + options.poll_timeout_s
    finally:
        # A reused consumer must not keep prefetching, nor keep partitions paused.
        consumer.resume([TopicPartition(t, p) for t, p, _s, _e in ranges])
        consumer.unassign()


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


def _finish(
    consumer: Consumer, todo: dict[TopicPartitionKey, tuple[int, int]], tp: TopicPartitionKey
) -> None:
    if todo.pop(tp, None) is not None:
        consumer.pause([TopicPartition(tp[0], tp[1])])


def _on_gap(options: SourceOptions, tp: TopicPartitionKey, start: int, first: int) -> None:
    # The first record is past the range start: records were deleted (retention) or compacted
    # away. Spark's Kafka source fails the query here unless failOnDataLoss=false.
    if options.fail_on_data_loss:
        msg = (
            f"refold_kafka: {tp[0]}/{tp[1]} offsets {start}..{first - 1} are no longer in "
            "the log (retention or compaction). Operator action: set failOnDataLoss=false "
            "to skip them, or rebuild from the earliest offset with `replay`."
        )
        raise RuntimeError(msg)
    logger.warning("%s/%d: skipping lost offsets %d..%d", tp[0], tp[1], start, first - 1)


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
        tps = self._partitions()
        starts = self.probe.start_offsets(tps)
        spec = self.options.starting_offsets
        if spec == "earliest":
            resolved = starts
        elif spec == "latest":
            resolved = self.probe.end_offsets(tps)
        else:
            try:
                requested = _flatten(json.loads(spec))
            except (ValueError, AttributeError, TypeError) as exc:
                msg = f"refold_kafka: startingOffsets is not earliest, latest or JSON: {spec}"
                raise ValueError(msg) from exc
            ends = self.probe.end_offsets(tps) if _LATEST in requested.values() else {}
            resolved = {}
            for tp in tps:
                wanted = requested.get(tp, _EARLIEST)
                if wanted == _EARLIEST:
                    resolved[tp] = starts[tp]
                elif wanted == _LATEST:
                    resolved[tp] = ends[tp]
                elif wanted < starts[tp]:
                    resolved[tp] = self._below_start(tp, wanted, starts[tp])
                else:
                    resolved[tp] = wanted
        if self._last_end is None:
            self._last_end = dict(resolved)
        self._initial = _nest(resolved)
        return self._initial

    def _below_start(self, tp: TopicPartitionKey, wanted: int, start: int) -> int:
        if self.options.fail_on_data_loss:
            msg = (
                f"refold_kafka: startingOffsets asks for {tp[0]}/{tp[1]} at {wanted}, but the "
                f"log starts at {start}. Operator action: start at or after {start}, or set "
                "failOnDataLoss=false."
            )
            raise ValueError(msg)
        return start

    def latestOffset(self) -> Offsets:  # noqa: N802 - Spark's method name
        """The log end, capped by ``maxOffsetsPerTrigger`` (driver; called every trigger)."""
        if self._last_end is None:
            self.initialOffset()  # a fresh query: its first batch starts there
        assert self._last_end is not None  # noqa: S101 - set by initialOffset
        # The cheap mode: Spark asks every trigger, and a record the answer misses by one Fetch
        # is planned by the next trigger (LogOffsets documents the trade).
        ends = self.probe.end_offsets(self._partitions(), fresh=False)
        # Never behind what was already planned: an end offset only moves forward.
        ends = {tp: max(e, self._last_end.get(tp, 0)) for tp, e in ends.items()}
        if self.options.max_offsets_per_trigger:
            ends = cap_offsets(self._last_end, ends, self.options.max_offsets_per_trigger)
        self._last_end = dict(ends)
        return _nest(ends)

    def partitions(self, start: Offsets, end: Offsets) -> list[KafkaRangePartition]:
        """Split ``[start, end)`` into tasks (driver)."""
        begin, finish = _flatten(start), _flatten(end)
        if self._last_end is None:
            # A restarted query plans its checkpointed batch first: seed the rate limit there.
            self._last_end = dict(finish)
        else:
            self._last_end = {tp: max(o, self._last_end.get(tp, 0)) for tp, o in finish.items()}
        ranges = [
            (t, p, begin.get((t, p), 0), e)
            for (t, p), e in sorted(finish.items())
            if e > begin.get((t, p), 0)
        ]
        return [
            KafkaRangePartition(group)
            for group in coalesce_ranges(
                ranges, self.options.max_tasks, self.options.min_records_per_task
            )
        ]

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
