"""Kafka offset ranges: plan them and read exactly their records, with no Spark involved.

The planning helpers (:func:`cap_offsets`, :func:`coalesce_ranges`) run on the Spark driver;
:func:`read_messages` runs wherever records are folded: a Spark task's Python worker, or a
:class:`~refold.processors.runtime.envelope.FoldWriter` that re-reads a range Redis lost (the
applied positions in Redis are the truth, DESIGN.md decision 9). Kept apart from ``kafka_source`` so
that these paths do not import pyspark.

Lifecycle: consumers are cached per process (Spark reuses Python workers) in this module, created
on first use, never in ``__init__``; they are assigned explicitly and never join a group.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from refold.contracts.archive_coverage import ArchiveLedger
from refold.contracts.kafka.consumers import passive_consumer
from refold.contracts.kafka.offsets import LogOffsets, TopicPartitionKey
from refold.contracts.kafka.offsets_json import parse_offsets_json

__all__ = [
    "Range",
    "SourceOptions",
    "TaskPlan",
    "batch_ranges_between",
    "cap_offsets",
    "coalesce_ranges",
    "read_log",
    "read_messages",
    "resolve_starting_offsets",
]

logger = logging.getLogger(__name__)

# Most records per consume() call in read(). consume(n, timeout) returns only when it has n
# messages or the timeout passed, so read() never asks for more than its ranges still hold:
# otherwise the last call of every task would wait out the whole timeout (0.5 s per batch).
_CONSUME_BATCH = 10_000

_EARLIEST, _LATEST = -2, -1

Range = tuple[str, int, int, int]  # topic, partition, start (inclusive), end (exclusive)

# Fewer records than this in a batch: fewer tasks (see coalesce_ranges).
_MIN_RECORDS_PER_TASK = 25_000


@dataclass(frozen=True, slots=True)
class TaskPlan:
    """How a batch's ranges are split into tasks: by the source, or by a sink that plans them.

    Attributes:
        max_tasks: At most this many tasks a batch (None: one per partition id).
        min_records_per_task: A small batch gets fewer tasks (see :func:`coalesce_ranges`).
    """

    max_tasks: int | None = None
    min_records_per_task: int = _MIN_RECORDS_PER_TASK

    def groups(self, ranges: list[Range]) -> list[tuple[Range, ...]]:
        """The ranges of each task."""
        return coalesce_ranges(ranges, self.max_tasks, self.min_records_per_task)


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
    min_records_per_task: int = _MIN_RECORDS_PER_TASK
    poll_timeout_s: float = 120.0
    archive_root: str = ""
    # ``endingOffsets``: per partition, the offset the stream stops before (state as of a
    # moment); a partition it does not name is unbounded.
    ending_offsets: tuple[tuple[TopicPartitionKey, int], ...] = ()

    @property
    def tasks(self) -> TaskPlan:
        """How the source splits a batch into tasks."""
        return TaskPlan(self.max_tasks, self.min_records_per_task)

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
            min_records_per_task=int(min_per_task) if min_per_task else _MIN_RECORDS_PER_TASK,
            poll_timeout_s=float(lowered.get("kafkaconsumer.polltimeoutms", "120000")) / 1000,
            archive_root=lowered.get("archiveroot", ""),
            ending_offsets=_ending_offsets(lowered.get("endingoffsets", "")),
        )

    def bounded(self, ends: Mapping[TopicPartitionKey, int]) -> dict[TopicPartitionKey, int]:
        """``ends`` held at ``endingOffsets``: a batch never plans a record at or past them."""
        bound = dict(self.ending_offsets)
        return {tp: min(e, bound[tp]) if tp in bound else e for tp, e in ends.items()}


def _ending_offsets(text: str) -> tuple[tuple[TopicPartitionKey, int], ...]:
    """``endingOffsets`` (Spark's offsets JSON; "" or ``latest``: none), sorted."""
    if not text.strip() or text.strip() == "latest":
        return ()
    try:
        offsets = parse_offsets_json(text)
    except ValueError as exc:
        msg = f"refold_kafka: endingOffsets is not offsets JSON ({exc}): {text[:200]}"
        raise ValueError(msg) from None
    if any(o < 0 for o in offsets.values()):
        msg = f"refold_kafka: endingOffsets takes offsets >= 0 (no -1/-2): {text[:200]}"
        raise ValueError(msg)
    return tuple(sorted(offsets.items()))


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


def batch_ranges_between(
    begin: Mapping[TopicPartitionKey, int], finish: Mapping[TopicPartitionKey, int]
) -> list[Range]:
    """A batch's non-empty ranges, from its start to its end offsets, in partition order.

    A partition with no start offset (new in this batch) starts at 0. Refold's sources plan
    their batches so, and a sink that plans a batch from Spark's offsets log must read the same.
    """
    return [
        (t, p, begin.get((t, p), 0), e)
        for (t, p), e in sorted(finish.items())
        if e > begin.get((t, p), 0)
    ]


def coalesce_ranges(
    ranges: list[Range], max_tasks: int | None, min_records_per_task: int = 0
) -> list[tuple[Range, ...]]:
    """Group partition ranges into at most ``max_tasks`` tasks of similar record counts.

    Tasks are planned by partition id across all subscribed topics: the ranges of one partition
    number (of every topic) stay whole in one task, so an entity of co-partitioned topics
    (same key, same partition count) is folded by one writer. With ``min_records_per_task``, a
    small batch gets fewer tasks (at least one): each task has a fixed cost, so splitting a few
    thousand records only adds latency.
    """
    if not ranges:
        return []
    units: dict[int, list[Range]] = {}
    for rng in ranges:
        units.setdefault(rng[1], []).append(rng)
    if min_records_per_task > 0:
        records = sum(r[3] - r[2] for r in ranges)
        by_size = max(1, records // min_records_per_task)
        max_tasks = by_size if max_tasks is None else min(max_tasks, by_size)
    if max_tasks is None or max_tasks >= len(units):
        return [tuple(sorted(u)) for _p, u in sorted(units.items())]
    bins: list[list[Range]] = [[] for _ in range(max(1, max_tasks))]
    sizes = [0] * len(bins)
    for partition, unit in sorted(
        units.items(), key=lambda kv: (-sum(r[3] - r[2] for r in kv[1]), kv[0])
    ):
        del partition
        lightest = sizes.index(min(sizes))
        bins[lightest].extend(unit)
        sizes[lightest] += sum(r[3] - r[2] for r in unit)
    return [tuple(sorted(b)) for b in bins if b]


# A range reader's defaults (the user's librdkafka settings may override them):
_READ_TUNING: Final[Mapping[str, Any]] = {
    "fetch.queue.backoff.ms": 10,  # the 1 s default throttles bulk reads ~8x
    # Ranges end at or near the log end, where a fetch waits up to this long for more
    # data; one fetch per broker is in flight, so the other partitions wait behind it.
    # 10 ms instead of 100 took reading 3k records over 8 partitions from ~50 to ~10 ms.
    "fetch.wait.max.ms": 10,
}
# Executor side: one consumer per (Kafka config) per Python worker process.
_CONSUMERS: dict[tuple[str, tuple[tuple[str, str], ...]], Consumer] = {}


def _consumer(kafka: tuple[tuple[str, str], ...], slot: str) -> Consumer:
    consumer = _CONSUMERS.get((slot, kafka))
    if consumer is None:
        # The user's settings tune the read but, applied before the passive keys, can never
        # make it commit or change what it reads.
        consumer = _CONSUMERS[slot, kafka] = passive_consumer(
            dict(kafka),
            "refold-source",  # required by librdkafka; never joined or committed
            tuning=_READ_TUNING,
            # Processors write their outputs in transactions: an aborted batch is never read.
            isolation="read_committed",
            eof=True,  # tells a range that ends at the log end it is done
            offset_reset="earliest",  # a start below the log start is checked below
        )
    return consumer


def read_messages(
    options: SourceOptions, ranges: tuple[Range, ...], slot: str = "source"
) -> Iterator[list[Message]]:
    """Read exactly the records of ``ranges``, in chunks of confluent-kafka messages (executor).

    Every message yielded is a record of a range, in offset order per partition.

    Args:
        options: Kafka settings and read options.
        ranges: ``(topic, partition, start, end)``, end exclusive.
        slot: Which of the process's cached consumers reads: one read may run while another
            is suspended (a task's writer folds a lost range again in the middle of the task's
            own read), and a consumer has one assignment at a time.

    With ``options.archive_root``, the records of a range below its partition's log start
    (deleted by retention) are read from the archive, the log's cold tier
    (:func:`~refold.processors.runtime.archive.cold_tier.read_archived`), then the rest from Kafka:
    the same records, in the same order.

    Raises:
        RuntimeError: Records below a range's start are gone (with ``failOnDataLoss``, and not
            in the archive), a broker error, or no progress within the poll timeout (Spark
            retries the task).
        ColdTierError: The archive does not cover the records below the log start, or one of
            its files cannot serve them.
    """
    todo = {(t, p): (s, e) for t, p, s, e in ranges if e > s}
    if not todo:
        return
    consumer = _consumer(options.kafka, slot)
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
            chunk: list[Any] = []  # confluent-kafka messages (and archived ones before them)
            for message in messages:
                tp = (message.topic() or "", message.partition() or 0)
                if tp not in todo:
                    continue
                start, end = todo[tp]
                error = message.error()
                eof = error is not None and error.code() == KafkaError._PARTITION_EOF  # noqa: SLF001 - librdkafka's public name
                if error is not None and not eof:
                    msg = f"refold_kafka: reading {tp[0]}/{tp[1]} failed: {error.str()}"
                    raise RuntimeError(msg)
                offset = int(message.offset() or 0)
                if offset > next_offset[tp] and next_offset[tp] == start:
                    # The first record (or the log's end) is past the range's start.
                    cold = _below_log_start(consumer, options, tp, start, min(offset, end))
                    if cold is not None:
                        if chunk:
                            yield chunk
                            chunk = []
                        yield from cold
                        next_offset[tp] = min(offset, end)
                if eof or offset >= end:
                    if offset >= end:
                        _finish(consumer, todo, tp)
                    continue
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


def _finish(
    consumer: Consumer, todo: dict[TopicPartitionKey, tuple[int, int]], tp: TopicPartitionKey
) -> None:
    if todo.pop(tp, None) is not None:
        consumer.pause([TopicPartition(tp[0], tp[1])])


def _below_log_start(
    consumer: Consumer, options: SourceOptions, tp: TopicPartitionKey, start: int, first: int
) -> Iterator[list[Any]] | None:
    """The first record is past the range start: a loss only if the log starts past it.

    Inside the log, offsets without a record a reader gets are transaction markers, records of
    aborted transactions (the reader is read_committed, librdkafka's default) or records
    compaction removed: nothing is lost. Below the log start, records were deleted (retention):
    with an archive, they are read from it (the chunks returned); without, Spark's Kafka
    source fails the query then unless failOnDataLoss=false.

    Args:
        consumer: The consumer reading the partition.
        options: The read's options.
        tp: The partition.
        start: The range's start.
        first: The first offset Kafka handed over (or its end), capped at the range's end.

    Returns:
        The archive's chunks of ``[start, min(log start, first))``, or None: nothing to read
        there (no gap, or records skipped as the options allow).
    """
    log_start, _end = consumer.get_watermark_offsets(
        TopicPartition(*tp), timeout=options.poll_timeout_s
    )
    if log_start <= start:
        return None
    if options.archive_root:
        # Imported here: the cold tier brings pyarrow's Parquet reader, which only a read
        # below the log start needs.
        from refold.processors.runtime.archive.cold_tier import read_archived

        upto = min(log_start, first)
        logger.info(
            "%s/%d: offsets %d..%d from the archive (below the log start %d)",
            tp[0],
            tp[1],
            start,
            upto - 1,
            log_start,
            extra={"topic": tp[0], "partition": tp[1]},
        )
        return read_archived(Path(options.archive_root), tp[0], tp[1], start, upto)
    _lost(options, tp, start, log_start, first)
    return None


def _lost(
    options: SourceOptions, tp: TopicPartitionKey, start: int, log_start: int, first: int
) -> None:
    """Records below the log start and no archive: refuse, or skip them if allowed."""
    if options.fail_on_data_loss:
        msg = (
            f"refold_kafka: {tp[0]}/{tp[1]} offsets {start}..{log_start - 1} are no longer in "
            "the log (retention). Operator action: set failOnDataLoss=false to skip them, or "
            "rebuild from the earliest offset with `replay`."
        )
        raise RuntimeError(msg)
    logger.warning("%s/%d: skipping lost offsets %d..%d", tp[0], tp[1], start, first - 1)


def resolve_starting_offsets(
    probe: LogOffsets,
    topics: Iterable[str],
    spec: str,
    *,
    fail_on_data_loss: bool = True,
    archive_root: str = "",
) -> dict[TopicPartitionKey, int]:
    """Resolve a ``startingOffsets`` option to an offset per partition (driver side).

    The one resolution for the source's first batch and for the starting positions a
    processor records in Redis, so both agree exactly.

    Args:
        probe: Reads partitions and log bounds.
        topics: Subscribed topics.
        spec: ``earliest``, ``latest`` or ``{"topic": {"0": 42}}`` (-2 earliest, -1 latest;
            partitions left out start at the earliest offset).
        fail_on_data_loss: Refuse an offset below the log start instead of clamping to it.
        archive_root: The archive that serves offsets below the log start: an offset there is
            kept when the archive covers every record up to the log start.

    Raises:
        ValueError: ``spec`` is not one of those forms, or asks for records that are gone
            (from the log, and from the archive when there is one).
    """
    tps = [(t, p) for t in topics for p in probe.partitions(t)]
    starts = probe.start_offsets(tps)
    if spec == "earliest":
        return starts
    if spec == "latest":
        return probe.end_offsets(tps)
    try:
        requested = parse_offsets_json(spec)
    except ValueError as exc:
        msg = f"refold_kafka: startingOffsets is not earliest, latest or JSON: {spec}"
        raise ValueError(msg) from exc
    ends = probe.end_offsets(tps) if _LATEST in requested.values() else {}
    resolved = {}
    for tp in tps:
        wanted = requested.get(tp, _EARLIEST)
        if wanted == _EARLIEST:
            resolved[tp] = starts[tp]
        elif wanted == _LATEST:
            resolved[tp] = ends[tp]
        elif wanted < starts[tp] and archive_root:
            gaps = ArchiveLedger(Path(archive_root)).read(*tp).gaps(wanted, starts[tp])
            if gaps:
                missing = ", ".join(f"{s}..{e - 1}" for s, e in gaps)
                msg = (
                    f"refold_kafka: startingOffsets asks for {tp[0]}/{tp[1]} at {wanted}; the "
                    f"log starts at {starts[tp]} and the archive at {archive_root} lacks "
                    f"offsets {missing}. Operator action: start where the archive or the log "
                    "has every record, or set failOnDataLoss=false."
                )
                raise ValueError(msg)
            resolved[tp] = wanted
        elif wanted < starts[tp]:
            if fail_on_data_loss:
                msg = (
                    f"refold_kafka: startingOffsets asks for {tp[0]}/{tp[1]} at {wanted}, but "
                    f"the log starts at {starts[tp]}. Operator action: start at or after "
                    f"{starts[tp]}, or set failOnDataLoss=false."
                )
                raise ValueError(msg)
            resolved[tp] = starts[tp]
        else:
            resolved[tp] = wanted
    return resolved


def read_log(
    kafka: Mapping[str, str], topic: str, per_partition: int | None = None, slot: str = "log"
) -> Iterator[list[Message]]:
    """Every record of ``topic`` from each partition's start, in chunks (driver side).

    Each partition's records in log order, at most ``per_partition`` of each: what an oracle or
    a benchmark reads back.
    """
    offsets = LogOffsets(kafka)
    try:
        tps = [(topic, p) for p in offsets.partitions(topic)]
        starts, ends = offsets.start_offsets(tps), offsets.end_offsets(tps)
    finally:
        offsets.close()
    spans = []
    for tp in tps:
        end = ends[tp] if per_partition is None else min(ends[tp], starts[tp] + per_partition)
        spans.append((tp[0], tp[1], starts[tp], end))
    options = SourceOptions(kafka=tuple(kafka.items()), topics=(topic,))
    try:
        yield from read_messages(options, tuple(spans), slot)
    finally:
        # Driver side, not a reused worker: close the consumer. A cached one would keep
        # refreshing metadata of topics that may be deleted later (librdkafka crashed on that
        # in a long test process, in rd_kafka_metadata_cache_find).
        consumer = _CONSUMERS.pop((slot, options.kafka), None)
        if consumer is not None:
            consumer.close()
