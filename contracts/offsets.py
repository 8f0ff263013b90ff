"""Log offsets as every refold component must read them: right on Apache Kafka and on Tansu.

Tansu deviation (see tansu.md): ListOffsets LATEST returns the base offset of the newest batch
+ 1, so ``get_watermark_offsets()`` without ``cached`` and OFFSET_END are wrong there. The log
end is therefore read from the *fetch path*: assign the partition near its end and consume until
librdkafka reports end-of-partition; the EOF event carries the high watermark of that fetch.
This is exactly right on Kafka too (it is what a consumer sees as the end of the log).

Lifecycle: one :class:`LogOffsets` per process and thread (not thread-safe, not picklable); its
consumer is created on first use and never joins a group or commits.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from contracts.errors import RefoldError

__all__ = ["LogOffsets", "OffsetsError", "TopicPartitionKey"]

TopicPartitionKey = tuple[str, int]

_PROBE_DEFAULTS: dict[str, Any] = {
    # Never used to join or commit: assign() only.
    "group.id": "refold-offset-probe",
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    # The end-of-partition event is how the fetch path reports the high watermark.
    "enable.partition.eof": True,
    # Tansu auto-creates unknown topics on first use; a probe must never create one.
    "allow.auto.create.topics": False,
    # Only watermarks are wanted: keep each fetch small (Kafka still returns one whole batch).
    "max.partition.fetch.bytes": 1024,
    # Short waits: an idle partition answers within this, and EOF follows at once.
    "fetch.wait.max.ms": 20,
    "fetch.queue.backoff.ms": 10,
    # A start target past the end (Tansu's wrong LATEST could put it there) falls back to
    # reading from the beginning, which is slower but still exact.
    "auto.offset.reset": "earliest",
}
_TIMEOUT_S = 30.0


class OffsetsError(RefoldError):
    """Offsets could not be read (unknown topic, broker unreachable, timeout)."""

    code = "OFFSETS_UNAVAILABLE"
    retriable = True


class LogOffsets:
    """Reads partitions, log start and log end offsets of topics.

    Args:
        config: librdkafka settings (at least ``bootstrap.servers``).
        timeout: Seconds before a call gives up.
    """

    def __init__(self, config: Mapping[str, Any], timeout: float = _TIMEOUT_S) -> None:
        self._config = {**_PROBE_DEFAULTS, **config}
        self._timeout = timeout
        self._consumer: Consumer | None = None
        self._known_end: dict[TopicPartitionKey, int] = {}

    @property
    def consumer(self) -> Consumer:
        """The probe's consumer (created on first use)."""
        if self._consumer is None:
            self._consumer = Consumer(self._config)
        return self._consumer

    def partitions(self, topic: str) -> list[int]:
        """The partition ids of ``topic``, sorted.

        Raises:
            OffsetsError: The topic does not exist or the broker does not answer.
        """
        try:
            metadata = self.consumer.list_topics(topic, timeout=self._timeout)
        except Exception as exc:
            msg = f"cannot read metadata of topic {topic}: {exc}"
            raise OffsetsError(msg) from exc
        found = metadata.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            reason = found.error if found is not None and found.error else "it does not exist"
            msg = f"topic {topic} is not available: {reason}"
            raise OffsetsError(msg)
        return sorted(found.partitions)

    def start_offsets(self, tps: Iterable[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """First retained offset of each partition (ListOffsets EARLIEST: right on both)."""
        result = {}
        for topic, partition in tps:
            low, _high = self._listed(topic, partition)
            result[(topic, partition)] = low
        return result

    def _listed(self, topic: str, partition: int) -> tuple[int, int]:
        try:
            low, high = self.consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=self._timeout, cached=False
            )
        except Exception as exc:
            msg = f"cannot list offsets of {topic}/{partition}: {exc}"
            raise OffsetsError(msg) from exc
        return int(low), int(high)

    def end_offsets(self, tps: Iterable[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """The log end (high watermark) of each partition, read from the fetch path.

        Everything acknowledged before the call is counted. Repeated calls are cheap: the probe
        resumes at the previous end, so it reads only records produced since.

        Raises:
            OffsetsError: No end-of-partition report within the timeout.
        """
        wanted = list(dict.fromkeys(tps))
        if not wanted:
            return {}
        starts = {}
        for topic, partition in wanted:
            known = self._known_end.get((topic, partition))
            if known is None:
                low, listed = self._listed(topic, partition)
                # On Tansu `listed` is the newest batch's base + 1; on Kafka it is the end.
                # Either way, starting one below it reads at most the newest batch.
                known = max(low, listed - 1)
            starts[(topic, partition)] = known
        consumer = self.consumer
        consumer.assign([TopicPartition(t, p, o) for (t, p), o in starts.items()])
        ends: dict[TopicPartitionKey, int] = {}
        deadline = time.monotonic() + self._timeout
        while len(ends) < len(wanted):
            if time.monotonic() > deadline:
                missing = sorted(set(wanted) - set(ends))
                msg = f"no end-of-partition report for {missing} within {self._timeout:.0f}s"
                raise OffsetsError(msg)
            for message in consumer.consume(10_000, timeout=0.05):
                error = message.error()
                key = (message.topic() or "", message.partition() or 0)
                if error is None:
                    continue  # records between our start and the end: not needed
                if error.code() == KafkaError._PARTITION_EOF:  # noqa: SLF001 - librdkafka's public name
                    ends[key] = int(message.offset() or 0)
                elif error.fatal() or not error.retriable():
                    msg = f"reading the end of {key[0]}/{key[1]} failed: {error.str()}"
                    raise OffsetsError(msg)
        consumer.unassign()
        self._known_end.update(ends)
        return {tp: ends[tp] for tp in wanted}

    def record_timestamp(self, topic: str, partition: int, offset: int) -> tuple[int, int] | None:
        """Timestamp (ms) and offset of the first record at or after ``offset``.

        Returns:
            ``(timestamp_ms, offset)``, or None when there is no record at or after ``offset``.
        """
        consumer = self.consumer
        consumer.assign([TopicPartition(topic, partition, offset)])
        deadline = time.monotonic() + self._timeout
        try:
            while time.monotonic() < deadline:
                for message in consumer.consume(1, timeout=0.1):
                    error = message.error()
                    if error is None:
                        _kind, ts = message.timestamp()
                        return ts, int(message.offset() or 0)
                    if error.code() == KafkaError._PARTITION_EOF:  # noqa: SLF001 - public name
                        return None
                    msg = f"reading {topic}/{partition}@{offset} failed: {error.str()}"
                    raise OffsetsError(msg)
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
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
