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
  was sent after the call began; costs one round trip plus, on Tansu, one batch. Nothing stays
  assigned afterwards.
* ``fresh=False``: for a caller that asks often (the Spark driver asks every trigger). One
  batched ListOffsets LATEST, which on Kafka is the end; on Tansu it trails the end by the
  newest batch, and only a partition whose listed value has not moved since the previous
  call (an idle one, whose newest batch would otherwise wait) is measured on the fetch path,
  once per value. So a busy log costs no Fetch at all, and an idle one a single Fetch.

Nothing tails the log: on Tansu every Fetch costs the broker time in proportion to the number
of batches in the partition (measured: ~1 us per batch), so a consumer kept polling at the end
of a log written in small batches grew to a whole core of broker CPU within a minute.

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
from contracts.kafka.logs import routed

__all__ = ["LogOffsets", "OffsetsError", "TopicPartitionKey"]

logger = logging.getLogger(__name__)

TopicPartitionKey = tuple[str, int]

# librdkafka's queue limits for the probe: small, since it needs one record per partition.
_QUEUED_MIN_MESSAGES: Final = 20_000
_QUEUED_MAX_KBYTES: Final = 8_192

_TUNING: Final[dict[str, Any]] = {
    # An empty partition answers the probe (end-of-partition) after this long-poll.
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
        # Per partition: the best known end, the last ListOffsets LATEST answer, and the answer
        # at which the end was last measured on the fetch path (see the module docstring).
        self._tracked: dict[TopicPartitionKey, int] = {}
        self._listed: dict[TopicPartitionKey, int] = {}
        self._exact_at: dict[TopicPartitionKey, int] = {}

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
            self._consumer = Consumer(routed(self._config))
        return self._consumer

    def _metadata_client(self) -> Consumer:
        # Metadata is read by a consumer that is never assigned: it honours
        # allow.auto.create.topics=false (an AdminClient does not, and Tansu would create the
        # topic), and its requests never queue behind the probe's long-poll Fetch.
        if self._metadata is None:
            self._metadata = Consumer(routed(self._config))
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
        """The log end (high watermark) of each partition.

        Args:
            tps: ``(topic, partition)`` pairs.
            fresh: True: count every record acknowledged before the call (one round trip on
                the fetch path). False: the cheap mode for a caller that asks often; on Tansu
                the answer may trail the log by its newest batch until the next call (see
                the module docstring). The first call for a partition is always fresh.

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
        """Measure ``wanted`` afresh on the fetch path; nothing stays assigned afterwards."""
        consumer = self._client()
        unknown = [tp for tp in wanted if tp not in self._tracked]
        lows = self._list(unknown, OffsetSpec.earliest())  # type: ignore[no-untyped-call]
        listed = self._list(unknown, OffsetSpec.latest())  # type: ignore[no-untyped-call]
        positions: dict[TopicPartitionKey, int] = {}
        for tp in wanted:
            low, high = (0, self._tracked[tp]) if tp in self._tracked else (lows[tp], listed[tp])
            # Kafka: `high` is the end, so `high - 1` is the last record. Tansu's listed LATEST
            # is the newest batch's base + 1, so `high - 1` is that batch's first record. Either
            # way a record exists there (unless the log is empty) and the first Fetch returns
            # it at once, with the watermark; starting at the end would wait for a long-poll.
            # (A position below the log start restarts at the start: auto.offset.reset.)
            positions[tp] = max(low, high - 1)
        # A full assign() starts a new fetch version for every partition: librdkafka drops
        # queued records and responses of older versions, so each record or end-of-partition
        # event received below answers a Fetch sent after this call began.
        consumer.assign([TopicPartition(t, p, o) for (t, p), o in sorted(positions.items())])
        try:
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
        finally:
            consumer.unassign()
        self._listed.update(listed)
        self._exact_at.update({tp: listed[tp] for tp in unknown})

    def _refresh(self, wanted: list[TopicPartitionKey]) -> None:
        """The cheap mode: ListOffsets, and the fetch path only where the log looks idle."""
        unknown = [tp for tp in wanted if tp not in self._tracked]
        if unknown:
            self._probe(unknown)
        known = [tp for tp in wanted if tp not in unknown]
        listed = self._list(known, OffsetSpec.latest())  # type: ignore[no-untyped-call]
        idle = []
        for tp in known:
            value = listed[tp]
            if value != self._listed.get(tp):
                # The log moved. On Tansu `value` trails the end by the newest batch; the
                # batch is picked up by a later call (once more arrives, or once it is idle).
                self._listed[tp] = value
                self._tracked[tp] = max(self._tracked[tp], value)
            elif self._exact_at.get(tp) != value:
                idle.append(tp)
        if idle:
            self._probe(idle)
            self._exact_at.update({tp: listed[tp] for tp in idle})

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
        self._tracked, self._listed, self._exact_at = {}, {}, {}
        self._admin = None  # AdminClient has no close(); dropping it ends its threads
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._metadata is not None:
            self._metadata.close()
            self._metadata = None
