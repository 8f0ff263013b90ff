"""Log offsets as every refold component reads them: partitions, log start, log end, time.

Ends, starts and times are one batched ListOffsets through an AdminClient: on Apache Kafka,
LATEST under read_uncommitted is the high watermark, which counts every record acknowledged
with acks=all before the call, and a timestamp gives the first offset whose record time is at
or after it. refold's readers read read_committed (a processor's outputs are written in
transactions: :mod:`refold.processors.runtime.output_transactions`): a range planned up to the high
watermark while a transaction is open is read once it commits or aborts, its aborted records
skipped. Partition metadata is read by a consumer that never subscribes (it honours
``allow.auto.create.topics=false``), and :meth:`LogOffsets.record_timestamp` reads one record's
time (the monitor's lag in seconds).

refold's first local broker, Tansu, answered LATEST and time lookups wrongly, so this module
used to read ends from the fetch path and times by a binary search over records. On Kafka
ListOffsets is right and costs one request (docs/design-notes.md).

Lifecycle: one :class:`LogOffsets` per process and thread (not thread-safe, not picklable); its
clients are created on first use, never join a group and never commit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Final

from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from refold.contracts.errors import RefoldError
from refold.contracts.kafka.consumers import passive_consumer_config
from refold.contracts.kafka.credentials import AuthWatch, not_answering, refused
from refold.contracts.kafka.logs import routed

__all__ = ["LogOffsets", "OffsetsError", "TopicPartitionKey"]

logger = logging.getLogger(__name__)

TopicPartitionKey = tuple[str, int]

_TUNING: Final[dict[str, Any]] = {
    # An empty partition answers a record read (end-of-partition) after this long-poll.
    "fetch.wait.max.ms": 100,
    # One record is wanted: keep each Fetch small (a broker still returns one whole batch).
    "max.partition.fetch.bytes": 65_536,
    "fetch.max.bytes": 1_048_576,
    "queued.min.messages": 20_000,
    "queued.max.messages.kbytes": 8_192,
}
# librdkafka wants a group id; the reader never subscribes, commits or joins it.
_GROUP: Final = "refold-offset-probe"
_TIMEOUT_S: Final = 30.0
# One ListOffsets attempt waits this long for the partitions' leaders; what it leaves
# unanswered is asked again through a new client (see LogOffsets._list).
_ATTEMPT_S: Final = 5.0
_CLIENT: Final = "the offsets client (log ends, partitions)"
# Local librdkafka events that it retries by itself; the call's deadline covers them.
# Partition errors in a ListOffsets answer that pass once leadership settles (a new topic, a
# broker back from a pause). A partition's error comes without librdkafka's retriable flag, so
# the codes are named here.
_LEADERSHIP: Final = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,
    }
)
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
_TIMED_OUT: Final = KafkaError._TIMED_OUT  # noqa: SLF001


class OffsetsError(RefoldError):
    """Offsets could not be read (unknown topic, broker unreachable, timeout)."""

    code = "OFFSETS_UNAVAILABLE"
    retriable = True


class LogOffsets:
    """Reads partitions, log start and log end offsets of topics, and offsets at a time.

    Args:
        config: librdkafka settings (at least ``bootstrap.servers``). Tuning keys may be
            overridden; the keys that keep the reader passive (group, commits, EOF events,
            auto-creation, isolation, offset reset) are always set, by
            :func:`~refold.contracts.kafka.consumers.passive_consumer_config`.
        timeout: Seconds before a call gives up.
    """

    def __init__(self, config: Mapping[str, Any], timeout: float = _TIMEOUT_S) -> None:
        # Every client of this reader tells it when Kafka refuses the login.
        self._auth = AuthWatch()
        self._admin_config: dict[str, Any] = {**config, "error_cb": self._auth}
        self._config: dict[str, Any] = {
            **passive_consumer_config(
                config,
                _GROUP,
                tuning=_TUNING,
                # The record at an offset as written: read_committed would wait out an open
                # transaction before answering record_timestamp.
                isolation="read_uncommitted",
                # An empty partition answers with an end-of-partition event, not a record.
                eof=True,
                # A position below the log start (retention raced the read) restarts there.
                offset_reset="earliest",
            ),
            "error_cb": self._auth,
        }
        self._timeout = timeout
        self._consumer: Consumer | None = None
        self._admin: AdminClient | None = None
        self._metadata: Consumer | None = None

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
        # allow.auto.create.topics=false (an AdminClient does not), and its requests never
        # queue behind a record read's long-poll Fetch.
        if self._metadata is None:
            self._metadata = Consumer(routed(self._config))
        return self._metadata

    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self._admin_config)
        return self._admin

    def partitions(self, topic: str) -> list[int]:
        """The partition ids of ``topic``, sorted.

        Raises:
            OffsetsError: The topic does not exist or the broker does not answer.
        """
        try:
            metadata = self._metadata_client().list_topics(topic, timeout=self._timeout)
        except KafkaException as exc:
            self._metadata_client().poll(0)  # serves the error callbacks (a refused login)
            if self._auth.failure is not None:
                raise refused(_CLIENT, self._config, self._auth.failure) from exc
            reason = not_answering(self._config, exc) or exc
            msg = f"cannot read metadata of topic {topic}: {reason}"
            raise OffsetsError(msg) from exc
        found = metadata.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            reason = found.error if found is not None and found.error else "it does not exist"
            msg = f"topic {topic} is not available: {reason}"
            raise OffsetsError(msg)
        return sorted(found.partitions)

    def start_offsets(self, tps: Iterable[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """First retained offset of each ``(topic, partition)`` (ListOffsets EARLIEST).

        Raises:
            OffsetsError: The broker did not answer within the timeout.
        """
        return self._list(list(dict.fromkeys(tps)), OffsetSpec.earliest())  # type: ignore[no-untyped-call]

    def end_offsets(self, tps: Iterable[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """The log end (high watermark) of each ``(topic, partition)``: the next record's offset.

        It counts every record acknowledged (acks=all) before the call.

        Raises:
            OffsetsError: The broker did not answer within the timeout, or a broker error.
        """
        return self._list(list(dict.fromkeys(tps)), OffsetSpec.latest())  # type: ignore[no-untyped-call]

    def offset_at_time(self, topic: str, partition: int, timestamp_ms: int) -> int:
        """The first offset whose record timestamp is at or after ``timestamp_ms``.

        Kafka's ListOffsets by time (the time index of each segment). It uses the topic's
        timestamps: the producers' CreateTime by default.

        Returns:
            An offset in ``[log start, log end]``; the log end when every record is older.
        """
        key = (topic, partition)
        found = self._list([key], OffsetSpec.for_timestamp(timestamp_ms))[key]
        return found if found >= 0 else self.end_offsets([key])[key]

    def _list(self, tps: list[TopicPartitionKey], spec: OffsetSpec) -> dict[TopicPartitionKey, int]:
        """One batched ListOffsets, retried within the timeout while the error is retriable.

        A topic created a moment ago has no leader on the broker yet (NOT_LEADER_FOR_PARTITION,
        LEADER_NOT_AVAILABLE), and a broker back from a pause answers FENCED_LEADER_EPOCH until
        its leaders have new epochs: both pass by themselves.

        A partition whose leader is gone (a node killed) is not an error to librdkafka (2.16):
        its ListOffsets goes to the leader the client's metadata names and waits for that node
        until the request's timeout, reconnecting in a tight loop; the partition then comes back
        with offset ``OFFSET_INVALID`` and no error, and the client keeps the stale leader, so
        the next call waits again. So an attempt is short (:data:`_ATTEMPT_S`; twice as long after
        one that timed out or that no leader answered: the cluster may only be slow), and the
        partitions it did not answer are asked again through a new client, which reads the
        metadata afresh: the new leader once the controller has moved it (it fences a node that
        stopped heartbeating after ``broker.session.timeout.ms``, 9 s by default).
        """
        if not tps:
            return {}
        deadline = time.monotonic() + self._timeout
        found: dict[TopicPartitionKey, int] = {}
        todo = list(tps)
        patience = _ATTEMPT_S
        while True:
            wait = max(0.1, min(patience, deadline - time.monotonic()))
            try:
                futures = self._admin_client().list_offsets(
                    {TopicPartition(t, p): spec for t, p in todo},
                    isolation_level=IsolationLevel.READ_UNCOMMITTED,
                    request_timeout=wait,
                )
                answers = {(tp.topic, tp.partition): f.result() for tp, f in futures.items()}
                unanswered = []
                for tp, answer in answers.items():
                    if int(answer.offset) == OFFSET_INVALID:
                        unanswered.append(tp)
                    else:
                        found[tp] = int(answer.offset)
                if not unanswered:
                    return {tp: found[tp] for tp in tps}
                # A leader did not answer in time (see above): a new client, new metadata.
                self._admin = None
                if len(unanswered) == len(todo):  # no leader answered: perhaps only slow
                    patience *= 2
                if time.monotonic() > deadline:
                    missing = ", ".join(f"{t}/{p}" for t, p in sorted(unanswered))
                    msg = (
                        f"no leader answered for the offsets of {missing} within "
                        f"{self._timeout:.0f}s"
                    )
                    raise OffsetsError(msg)
                logger.debug("offsets of %s unanswered (leader away); asking again", unanswered)
                todo = unanswered
            except KafkaException as exc:
                if self._admin is not None:
                    self._admin.poll(0)  # serves the error callbacks (a refused login)
                error = exc.args[0] if exc.args else None
                timed_out = isinstance(error, KafkaError) and error.code() == _TIMED_OUT
                if timed_out:
                    # The attempt was too short for the cluster as it is now (at load 50 the
                    # leaders' query took longer): the same client, which keeps its
                    # connections, waits twice as long.
                    patience *= 2
                else:
                    # A new client: after a broker was fenced (it stopped answering its
                    # controller, e.g. paused), one client kept failing with
                    # FENCED_LEADER_EPOCH on its old metadata instead of refreshing it (seen
                    # with librdkafka 2.16).
                    self._admin = None
                # A timeout comes without librdkafka's retriable flag: retried too, within
                # the call's timeout.
                retriable = timed_out or (
                    isinstance(error, KafkaError)
                    and (error.retriable() or error.code() in _LEADERSHIP)
                )
                refused_login = self._auth.failure is not None  # does not pass by itself
                if not retriable or refused_login or time.monotonic() > deadline:
                    self._admin = None
                    if self._auth.failure is not None:
                        raise refused(_CLIENT, self._config, self._auth.failure) from exc
                    topics = sorted({t for t, _p in tps})
                    msg = f"cannot list offsets of {', '.join(topics)}: {exc}"
                    raise OffsetsError(msg) from exc
                time.sleep(0.1)

    @staticmethod
    def _raise_unless_transient(error: KafkaError, tp: TopicPartitionKey) -> None:
        if error.code() in _TRANSIENT and not error.fatal():
            logger.debug("record read: %s", error.str())
            return
        msg = f"reading {tp[0]}/{tp[1]} failed: {error.str()}"
        raise OffsetsError(msg)

    def record_timestamp(self, topic: str, partition: int, offset: int) -> tuple[int, int] | None:
        """Timestamp (ms) and offset of the first record at or after ``offset``.

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

    def close(self) -> None:
        """Close the consumers (they never joined a group, so nothing else happens)."""
        self._admin = None  # AdminClient has no close(); dropping it ends its threads
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._metadata is not None:
            self._metadata.close()
            self._metadata = None
