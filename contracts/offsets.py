"""Log offsets as every refold component must read them: right on Apache Kafka and on Tansu.

Tansu deviation (tansu.md, "ListOffsets LATEST"): the LATEST answer is the base offset of the
newest batch + 1, so ``get_watermark_offsets()`` without ``cached``, OFFSET_END and
``auto.offset.reset=latest`` are wrong there. The log end is therefore read from the *fetch
path*: every Fetch response carries the partition's high watermark, which librdkafka caches
(``get_watermark_offsets(tp, cached=True)``). That value is what a consumer sees as the end of
the log on Kafka too, so nothing here is Tansu-specific in effect.

Two ways to ask for the end (:meth:`LogOffsets.end_offsets`):

* ``fresh=True`` (default): counts every record acknowledged before the call. The partitions are
  assigned a little below their end and the call waits until each has answered a Fetch that
  was sent after the call began; costs one round trip plus, on Tansu, one batch.
* ``fresh=False``: for a long-lived caller (the Spark driver asks every trigger). The consumer
  stays assigned at the high watermark and keeps long-polling, so the cached watermark trails
  the log by about one Fetch (at most ``fetch.wait.max.ms`` when idle). A call drains what the
  poll brought in and skips the backlog by seeking to the watermark; it measures afresh when
  the local queue grew so large that librdkafka may have stopped fetching.

Lifecycle: one :class:`LogOffsets` per process and thread (not thread-safe, not picklable); its
consumer is created on first use, never joins a group and never commits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Final

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from contracts.errors import RefoldError

__all__ = ["LogOffsets", "OffsetsError", "TopicPartitionKey"]

logger = logging.getLogger(__name__)

TopicPartitionKey = tuple[str, int]

# librdkafka's queue limits for the probe. It stops fetching a partition while the consumer
# queue holds at least this many messages or bytes, which would freeze the cached watermark;
# small limits also bound the probe's memory. See _refresh for how a full queue is detected.
_QUEUED_MIN_MESSAGES: Final = 20_000
_QUEUED_MAX_KBYTES: Final = 8_192

_TUNING: Final[dict[str, Any]] = {
    # Short long-polls: an idle partition answers within this, which bounds the staleness of
    # the cached watermark (and the wait for an empty partition's end-of-partition event).
    "fetch.wait.max.ms": 100,
    # librdkafka's 1 s default would delay fetching after the queue was full for that long.
    "fetch.queue.backoff.ms": 10,
    # Only watermarks are wanted: keep each Fetch small (a broker still returns one whole batch).
    "max.partition.fetch.bytes": 65_536,
    "fetch.max.bytes": 1_048_576,
    "queued.min.messages": _QUEUED_MIN_MESSAGES,
    "queued.max.messages.kbytes": _QUEUED_MAX_KBYTES,
    # A position below the log start (retention raced the probe) restarts at the start; any
    # record answers the probe, so this is never slow.
    "auto.offset.reset": "earliest",
}
_REQUIRED: Final[dict[str, Any]] = {
    # librdkafka wants a group id; the probe never subscribes, commits or joins it.
    "group.id": "refold-offset-probe",
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    # An empty partition answers the probe with an end-of-partition event, not with a record.
    "enable.partition.eof": True,
    # Tansu creates unknown topics on first use (tansu.md, "auto-creation"); a probe never may.
    "allow.auto.create.topics": False,
    # The fetch position must be able to reach the high watermark (not stop at the LSO).
    "isolation.level": "read_uncommitted",
}
_TIMEOUT_S: Final = 30.0
# Records taken per consume() call while draining the probe's queue.
_DRAIN_BATCH: Final = 10_000
# Local librdkafka events that it retries by itself; the call's deadline covers them.
_TRANSIENT: Final = frozenset(
    {
        KafkaError._TRANSPORT,  # noqa: SLF001 - librdkafka's public error names start with _
        KafkaError._ALL_BROKERS_DOWN,  # noqa: SLF001
        KafkaError._RESOLVE,  # noqa: SLF001
        KafkaError._TIMED_OUT,  # noqa: SLF001
        KafkaError._MAX_POLL_EXCEEDED,  # noqa: SLF001
    }
)
_EOF: Final = KafkaError._PARTITION_EOF  # noqa: SLF001


class OffsetsError(RefoldError):
    """Offsets could not be read (unknown topic, broker unreachable, timeout)."""

    code = "OFFSETS_UNAVAILABLE"
    retriable = True


class LogOffsets:
    """Reads partitions, log start and log end offsets of topics.

    Args:
        config: librdkafka settings (at least ``bootstrap.servers``). Tuning keys may be
            overridden; the keys that keep the probe passive (group, commits, EOF events,
            auto-creation, isolation) are always set by this class.
        timeout: Seconds before a call gives up.
    """

    def __init__(self, config: Mapping[str, Any], timeout: float = _TIMEOUT_S) -> None:
        self._admin_config: dict[str, Any] = dict(config)
        self._config: dict[str, Any] = {**_TUNING, **config, **_REQUIRED}
        self._timeout = timeout
        self._consumer: Consumer | None = None
        self._admin: AdminClient | None = None
        self._metadata: Consumer | None = None
        # Partitions kept assigned at their high watermark, with the last watermark seen.
        self._tracked: dict[TopicPartitionKey, int] = {}

    def __enter__(self) -> LogOffsets:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(self._config)
        return self._consumer

    def _metadata_client(self) -> Consumer:
        # Metadata is read by a consumer that is never assigned: it honours
        # allow.auto.create.topics=false (an AdminClient does not, and Tansu would create the
        # topic), and its requests never queue behind the probe's long-poll Fetch.
        if self._metadata is None:
            self._metadata = Consumer(self._config)
        return self._metadata

    def _admin_client(self) -> AdminClient:
        # ListOffsets goes through its own client: on the probe's connection it would queue
        # behind the long-poll Fetch (a broker answers one connection's
        # requests in order), costing up to fetch.wait.max.ms each.
        if self._admin is None:
            self._admin = AdminClient(self._admin_config)
        return self._admin

    def partitions(self, topic: str) -> list[int]:
        """The partition ids of ``topic``, sorted.

        Args:
            topic: Topic name.

        Returns:
            Partition ids.

        Raises:
            OffsetsError: The topic does not exist or the broker does not answer.
        """
        try:
            metadata = self._metadata_client().list_topics(topic, timeout=self._timeout)
        except KafkaException as exc:
            msg = f"cannot read metadata of topic {topic}: {exc}"
            raise OffsetsError(msg) from exc
        found = metadata.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            reason = found.error if found is not None and found.error else "it does not exist"
            msg = f"topic {topic} is not available: {reason}"
            raise OffsetsError(msg)
        return sorted(found.partitions)

    def start_offsets(self, tps: Iterable[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """First retained offset of each partition (ListOffsets EARLIEST: right on both).

        Args:
            tps: ``(topic, partition)`` pairs.

        Returns:
            The log start offset of each pair.

        Raises:
            OffsetsError: The broker did not answer within the timeout.
        """
        return self._list(list(dict.fromkeys(tps)), OffsetSpec.earliest())  # type: ignore[no-untyped-call]

    def _list(self, tps: list[TopicPartitionKey], spec: OffsetSpec) -> dict[TopicPartitionKey, int]:
        """One batched ListOffsets. LATEST is too low on Tansu (see the module docstring)."""
        if not tps:
            return {}
        try:
            futures = self._admin_client().list_offsets(
                {TopicPartition(t, p): spec for t, p in tps},
                isolation_level=IsolationLevel.READ_UNCOMMITTED,
                request_timeout=self._timeout,
            )
            return {(tp.topic, tp.partition): int(f.result().offset) for tp, f in futures.items()}
        except KafkaException as exc:
            topics = sorted({t for t, _p in tps})
            msg = f"cannot list offsets of {', '.join(topics)}: {exc}"
            raise OffsetsError(msg) from exc

    def end_offsets(
        self, tps: Iterable[TopicPartitionKey], fresh: bool = True
    ) -> dict[TopicPartitionKey, int]:
        """The log end (high watermark) of each partition, read from the fetch path.

        Args:
            tps: ``(topic, partition)`` pairs.
            fresh: True: count every record acknowledged before the call (one round trip).
                False: the cheap mode for a caller that asks often; the answer trails the log
                by about one Fetch (see the module docstring). The first call for a partition
                is always fresh.

        Returns:
            The high watermark of each pair (the offset the next record will get).

        Raises:
            OffsetsError: A partition did not answer within the timeout, or a broker error.
        """
        wanted = list(dict.fromkeys(tps))
        if not wanted:
            return {}
        if fresh:
            self._probe(wanted)
        else:
            self._refresh(wanted)
        return {tp: self._tracked[tp] for tp in wanted}

    def _probe(self, wanted: list[TopicPartitionKey]) -> None:
        """Measure ``wanted`` afresh and leave every tracked partition assigned at its end."""
        consumer = self._client()
        unknown = [tp for tp in wanted if tp not in self._tracked]
        lows = self._list(unknown, OffsetSpec.earliest())  # type: ignore[no-untyped-call]
        listed = self._list(unknown, OffsetSpec.latest())  # type: ignore[no-untyped-call]
        positions: dict[TopicPartitionKey, int] = {}
        for tp in wanted:
            if tp in self._tracked:
                low, high = self._cached(tp)
                low, high = max(low, 0), max(high, self._tracked[tp])
            else:
                low, high = lows[tp], listed[tp]
            # Kafka: `high` is the end, so `high - 1` is the last record. Tansu's listed LATEST
            # is the newest batch's base + 1, so `high - 1` is that batch's first record. Either
            # way a record exists there (unless the log is empty) and the first Fetch returns
            # it at once, with the watermark; starting at the end would wait for a long-poll.
            positions[tp] = max(low, high - 1)
        keep = {tp: self._cached_end(tp, default=end) for tp, end in self._tracked.items()}
        assignment = {**keep, **positions}
        # A full assign() starts a new fetch version for every partition: librdkafka drops
        # queued records and responses of older versions, so each record or end-of-partition
        # event received below answers a Fetch sent after this call began.
        consumer.assign([TopicPartition(t, p, o) for (t, p), o in sorted(assignment.items())])
        self._tracked = dict(keep)
        waiting = set(wanted)
        last_seen: dict[TopicPartitionKey, int] = {}
        deadline = time.monotonic() + self._timeout
        while waiting:
            if time.monotonic() > deadline:
                msg = f"no fetch answer for {sorted(waiting)} within {self._timeout:.0f}s"
                raise OffsetsError(msg)
            for message in consumer.consume(_DRAIN_BATCH, timeout=0.05):
                tp = (message.topic() or "", message.partition() or 0)
                error = message.error()
                if error is None:
                    last_seen[tp] = int(message.offset() or 0)
                elif error.code() != _EOF:
                    self._raise_unless_transient(error, tp)
                    continue
                waiting.discard(tp)
        for tp in wanted:
            end = self._cached_end(tp, default=-1)
            if end < last_seen.get(tp, -1) + 1:  # cannot happen: the answer carried it
                msg = f"{tp[0]}/{tp[1]}: no high watermark after a fetch (got {end})"
                raise OffsetsError(msg)
            self._tracked[tp] = end
        self._skip_backlog(last_seen)

    def _refresh(self, wanted: list[TopicPartitionKey]) -> None:
        """The cheap mode: drain the long-poll's records, check that fetching never stopped."""
        unknown = [tp for tp in wanted if tp not in self._tracked]
        if unknown:
            self._probe(unknown)
        consumer = self._client()
        count = size = 0
        last_seen: dict[TopicPartitionKey, int] = {}
        while True:
            messages = consumer.consume(_DRAIN_BATCH, timeout=0)
            for message in messages:
                tp = (message.topic() or "", message.partition() or 0)
                error = message.error()
                if error is None:
                    count += 1
                    size += len(message.value() or b"") + len(message.key() or b"")
                    last_seen[tp] = int(message.offset() or 0)
                elif error.code() != _EOF:
                    self._raise_unless_transient(error, tp)
            if len(messages) < _DRAIN_BATCH:
                break
        # librdkafka stops fetching while its queue is over either limit, so the cached
        # watermark could be old. The queue only grows between calls, so if it stayed below
        # half the limits fetching never stopped; otherwise measure afresh.
        if count >= _QUEUED_MIN_MESSAGES // 2 or size >= _QUEUED_MAX_KBYTES * 1024 // 2:
            self._probe(sorted({*self._tracked, *wanted}))
            return
        for tp in list(self._tracked):
            end = self._cached_end(tp, default=-1)
            if end < 0:  # the cache was reset (partition moved): measure it afresh
                self._probe([tp])
            else:
                self._tracked[tp] = end
        self._skip_backlog(last_seen)

    def _skip_backlog(self, last_seen: Mapping[TopicPartitionKey, int]) -> None:
        """Seek partitions that are behind their watermark to it: only the watermark matters.

        Only partitions that just delivered a record are moved: their fetcher is active (seek
        works) and answered since the last seek, so seeking does not starve it of answers.
        """
        consumer = self._client()
        for tp, offset in last_seen.items():
            end = self._tracked.get(tp)
            if end is not None and offset + 1 < end:
                try:
                    consumer.seek(TopicPartition(tp[0], tp[1], end))
                except KafkaException as exc:  # the long-poll then reads the backlog: harmless
                    logger.debug("offset probe: cannot seek %s/%d: %s", tp[0], tp[1], exc)

    def _cached(self, tp: TopicPartitionKey) -> tuple[int, int]:
        """Watermarks of the last Fetch answer; -1001 (OFFSET_INVALID) before any."""
        low, high = self._client().get_watermark_offsets(TopicPartition(tp[0], tp[1]), cached=True)
        return int(low), int(high)

    def _cached_end(self, tp: TopicPartitionKey, default: int) -> int:
        high = self._cached(tp)[1]
        return high if high >= 0 else default

    @staticmethod
    def _raise_unless_transient(error: KafkaError, tp: TopicPartitionKey) -> None:
        if error.code() in _TRANSIENT and not error.fatal():
            logger.debug("offset probe: %s", error.str())
            return
        msg = f"reading the end of {tp[0]}/{tp[1]} failed: {error.str()}"
        raise OffsetsError(msg)

    def record_timestamp(self, topic: str, partition: int, offset: int) -> tuple[int, int] | None:
        """Timestamp (ms) and offset of the first record at or after ``offset``.

        Args:
            topic: Topic name.
            partition: Partition id.
            offset: Where to start looking.

        Returns:
            ``(timestamp_ms, offset)``, or None when there is no record at or after ``offset``.

        Raises:
            OffsetsError: No answer within the timeout, or a broker error.
        """
        consumer = self._client()
        # Replaces the probe's assignment; the next end_offsets() call measures afresh.
        self._tracked = {}
        consumer.assign([TopicPartition(topic, partition, offset)])
        deadline = time.monotonic() + self._timeout
        try:
            while time.monotonic() < deadline:
                for message in consumer.consume(1, timeout=0.1):
                    error = message.error()
                    if error is None:
                        _kind, ts = message.timestamp()
                        return int(ts), int(message.offset() or 0)
                    if error.code() == _EOF:
                        return None
                    self._raise_unless_transient(error, (topic, partition))
        finally:
            consumer.unassign()
        msg = f"no answer reading {topic}/{partition}@{offset} within {self._timeout:.0f}s"
        raise OffsetsError(msg)

    def offset_at_time(self, topic: str, partition: int, timestamp_ms: int) -> int:
        """The first offset whose record timestamp is at or after ``timestamp_ms``.

        Binary search over record timestamps (about log2(records) single-record reads), because
        Tansu's ListOffsets-by-time uses broker append times and answers 0 past the last batch
        (tansu.md). On Kafka it matches ``offsets_for_times`` for CreateTime topics whose
        timestamps grow with offsets; out-of-order timestamps make any such lookup approximate.

        Args:
            topic: Topic name.
            partition: Partition id.
            timestamp_ms: Milliseconds since the epoch.

        Returns:
            An offset in ``[log start, log end]``; the log end when every record is older.
        """
        key = (topic, partition)
        low = self.start_offsets([key])[key]
        high = self.end_offsets([key])[key]
        while low < high:
            middle = (low + high) // 2
            found = self.record_timestamp(topic, partition, middle)
            if found is None:
                high = middle
                continue
            ts, at = found
            if ts >= timestamp_ms:
                high = middle
            else:
                low = at + 1
        return low

    def close(self) -> None:
        """Close the consumer (it never joined a group, so nothing else happens)."""
        self._tracked = {}
        self._admin = None  # AdminClient has no close(); dropping it ends its threads
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._metadata is not None:
            self._metadata.close()
            self._metadata = None
