"""Fold records: one Kafka record as every stage of a processor sees it (pure, picklable)."""

from __future__ import annotations

from typing import NamedTuple, Protocol

from refold.contracts.origin import ORIGIN_ID

__all__ = ["KafkaMessage", "SourceRecord"]


class KafkaMessage(Protocol):
    """The part of ``confluent_kafka.Message`` a fold record is built from (fakes type-check)."""

    def topic(self) -> str | None: ...  # noqa: D102 - confluent-kafka's accessors
    def partition(self) -> int | None: ...  # noqa: D102
    def offset(self) -> int | None: ...  # noqa: D102
    def key(self) -> bytes | None: ...  # noqa: D102
    def value(self) -> bytes | None: ...  # noqa: D102
    def timestamp(self) -> tuple[int, int]: ...  # noqa: D102
    def headers(  # noqa: D102
        self,
    ) -> dict[str, str | bytes | None] | list[tuple[str, str | bytes | None]] | None: ...


class SourceRecord(NamedTuple):
    """One Kafka record as the source hands it over.

    Attributes:
        topic: Source topic.
        partition: Source partition.
        offset: Offset in the partition.
        key: Kafka key (the partition key).
        value: Kafka value (Avro single-object encoding).
        timestamp: The record's Kafka timestamp, epoch milliseconds (CreateTime as the producer
            set it, or LogAppendTime), 0 when the broker gave none. Event-time processing reads
            the processor's own event-time field; this one is the log's clock.
        origin: The ``refold.origin`` header's value (a processor's output), if any.
        headers: The record's headers.
        timestamp_type: Kafka's timestamp type: 1 CreateTime, 2 LogAppendTime, 0 none (the
            archive keeps it, so a replay from the archive hands the record over as Kafka did).
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int = 0
    origin: str | None = None
    headers: tuple[tuple[str, str | bytes | None], ...] | None = None
    timestamp_type: int = 1

    @classmethod
    def of_message(cls, message: KafkaMessage) -> SourceRecord:
        """The fold record of a consumed confluent-kafka message."""
        kind, timestamp = message.timestamp()
        origin = None
        raw = message.headers() or ()
        headers = tuple(raw.items() if isinstance(raw, dict) else raw)
        for name, value in headers:
            if name == ORIGIN_ID and value is not None:
                origin = value.decode() if isinstance(value, bytes) else value
        return cls(
            message.topic() or "",
            message.partition() or 0,
            message.offset() or 0,
            message.key(),
            message.value(),
            max(timestamp, 0),  # -1 when the broker sent none (TIMESTAMP_NOT_AVAILABLE)
            origin,
            headers,
            kind,
        )
