"""One insight on its way to a webhook: its identity, its request, its dead-letter record (pure).

The identity of an insight is its **Idempotency-Key**: the record's ``refold.origin.id`` header
(:mod:`refold.contracts.origin`: the same in every run and replay of the producing processor), or,
for records without one, ``<topic>/<partition>@<offset>`` of the insight record itself (stable for
that topic's log). The same insight always goes out with the same key: on a retry, after a crash,
after a replay's cutover overlap, and on a redrive from the dead-letter topic.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from confluent_kafka import Message
from tenacity import RetryCallState

from refold.contracts.codec import EventCodec
from refold.contracts.errors import DeserializationError
from refold.contracts.origin import (
    DEAD_LETTER_ERROR,
    DEAD_LETTER_REASON,
    ORIGIN_GENERATION,
    ORIGIN_ID,
    ORIGIN_OFFSET,
    ORIGIN_PARTITION,
    ORIGIN_PROCESSOR,
    ORIGIN_TOPIC,
    failure_headers,
)
from refold.contracts.watermarks import is_marker
from refold.services.webhooks.delivery import AttemptResult, payload_json

__all__ = [
    "DLQ_HEADERS",
    "DeliveryItem",
    "build_payload",
    "dead_letter_headers",
    "fallback_key",
    "header_safe",
    "item_from_message",
]

# Headers the dispatcher adds to a dead letter (stripped again when it is redriven): why
# (refold.contracts.origin's, as every dead letter), how often it was tried, and the insight's
# identity.
ATTEMPTS = "refold.attempts"
W_NAME, W_ID = "refold.webhook.name", "refold.webhook.id"
W_TOPIC, W_PARTITION, W_OFFSET = (
    "refold.webhook.topic",
    "refold.webhook.partition",
    "refold.webhook.offset",
)
W_TIMESTAMP, W_STATUS, W_REDRIVES = (
    "refold.webhook.timestamp",
    "refold.webhook.status",
    "refold.webhook.redrives",
)
DLQ_HEADERS = frozenset(
    {DEAD_LETTER_REASON, DEAD_LETTER_ERROR, ATTEMPTS, W_NAME, W_ID, W_TOPIC, W_PARTITION}
    | {W_OFFSET, W_TIMESTAMP, W_STATUS, W_REDRIVES}
)
_SAFE = "!#$%&'()*+,-./:;<=>?@[]^_`{|}~"  # printable ASCII kept as is in header values

Headers = list[tuple[str, bytes]]


def fallback_key(topic: str, partition: int, offset: int) -> str:
    """The key of an insight record without ``refold.origin.id``: its own position."""
    return f"{topic}/{partition}@{offset}"


def header_safe(text: str) -> str:
    """``text`` as an HTTP header value: printable ASCII as is, anything else percent-encoded."""
    if text.isascii() and text.isprintable():
        return text
    return quote(text, safe=_SAFE)


def _text(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.lstrip("-").isdigit() else None


def build_payload(
    key: str,
    event_type: str,
    version: int,
    position: tuple[str, int, int, int],
    kafka_key: bytes | None,
    headers: dict[str, str],
    data: dict[str, Any],
) -> dict[str, Any]:
    """The JSON document POSTed for one insight (see docs/webhooks.md)."""
    topic, partition, offset, timestamp = position
    origin = {
        name: value
        for name, value in (
            ("id", headers.get(ORIGIN_ID)),
            ("topic", headers.get(ORIGIN_TOPIC)),
            ("partition", _int(headers.get(ORIGIN_PARTITION))),
            ("offset", _int(headers.get(ORIGIN_OFFSET))),
            ("processor", headers.get(ORIGIN_PROCESSOR)),
            ("generation", _int(headers.get(ORIGIN_GENERATION))),
        )
        if value is not None
    }
    return {
        "id": key,
        "type": event_type,
        "version": version,
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "timestamp": timestamp,
        "key": _text(kafka_key),
        "origin": origin,
        "data": data,
    }


@dataclass(slots=True, eq=False)
class DeliveryItem:
    """One record being delivered, and how it went so far (mutated by the scheduler only).

    Attributes:
        read_topic: Where the record was read (an insight topic, or the DLQ on a redrive).
        read_partition: Its partition there.
        read_offset: Its offset there (what the stored position moves past).
        topic: The insight record's topic (differs from ``read_topic`` on a redrive).
        partition: The insight record's partition.
        offset: The insight record's offset.
        timestamp: The insight record's timestamp (ms).
        kafka_key: The record key (the pattern's key).
        value: The record value (Avro), kept for the dead-letter record.
        headers: The insight record's headers (without those a dead letter adds).
        key: The Idempotency-Key.
        event_type: The decoded record's type (``Insight``), or ``""`` when it did not decode.
        body: The JSON request body.
        state: The retry state (tenacity) of this record.
        redrives: How many times it was redriven from the dead-letter topic (this one counted).
        answered_at_ms: When the last attempt was answered (epoch ms; 0: no attempt yet).
        severity: The record's ``severity`` field, if it has one (as ``Insight`` does).
    """

    read_topic: str
    read_partition: int
    read_offset: int
    topic: str
    partition: int
    offset: int
    timestamp: int
    kafka_key: bytes | None
    value: bytes | None
    headers: Headers
    key: str
    event_type: str
    body: bytes
    state: RetryCallState
    redrives: int = 0
    attempts: int = 0
    first_at: float | None = None
    last: AttemptResult | None = None
    final: str | None = None
    reason: str = ""
    detail: str = ""
    answered_at_ms: int = 0
    severity: str | None = None
    _done_at: float | None = field(default=None, repr=False)

    def record(self, result: AttemptResult) -> None:
        """Count one attempt and its result."""
        now = time.monotonic()
        if self.first_at is None:
            self.first_at = now - result.latency_ms / 1000
        self.attempts += 1
        self.last = result
        self._done_at = now
        self.answered_at_ms = int(time.time() * 1000)

    def elapsed_ms(self) -> float:
        """From the start of the first attempt to the last result."""
        if self.first_at is None or self._done_at is None:
            return 0.0
        return (self._done_at - self.first_at) * 1000

    def error_text(self) -> str:
        """The last error: the decoder's, or the last attempt's (empty when delivered)."""
        if self.detail:
            return self.detail
        if self.last is None or self.last.delivered:
            return ""
        return self.last.describe()

    def request_headers(self, dispatcher: str) -> dict[str, str]:
        """The headers of the next attempt (``Refold-Attempt`` counts from 1)."""
        headers = {
            "Idempotency-Key": header_safe(self.key),
            "Refold-Dispatcher": dispatcher,
            "Refold-Topic": header_safe(self.topic),
            "Refold-Partition": str(self.partition),
            "Refold-Offset": str(self.offset),
            "Refold-Event-Type": header_safe(self.event_type),
            "Refold-Attempt": str(self.attempts + 1),
        }
        if self.redrives:
            headers["Refold-Redrive"] = str(self.redrives)
        return headers


def _headers(message: Message) -> Headers:
    """A record's headers as ``(name, bytes)`` pairs (a missing value as empty bytes)."""
    given = message.headers() or []
    pairs = given.items() if isinstance(given, dict) else given
    return [(k, v.encode() if isinstance(v, str) else (v or b"")) for k, v in pairs]


def item_from_message(message: Message, codec: EventCodec, state: RetryCallState) -> DeliveryItem:
    """The delivery of one consumed record: an insight, or a dead letter being redriven.

    A record that does not decode is settled at once (``final == "failed"``, the decoder's
    reason): it goes to the dead-letter topic without an attempt. A watermark marker
    (:mod:`refold.contracts.watermarks`) is no event: settled at once as ``skipped``.
    """
    read_topic, read_partition, read_offset = (
        str(message.topic()),
        int(message.partition() or 0),
        int(message.offset() or 0),
    )
    raw = _headers(message)
    by_name = {k: v.decode("utf-8", "replace") for k, v in raw}
    kafka_key = message.key()
    value = message.value()
    redrives = 0
    if W_ID in by_name:  # a dead letter: the insight's own identity is in its headers
        key = by_name[W_ID]
        topic = by_name.get(W_TOPIC, read_topic)
        partition = _int(by_name.get(W_PARTITION)) or 0
        offset = _int(by_name.get(W_OFFSET)) or 0
        timestamp = _int(by_name.get(W_TIMESTAMP)) or 0
        redrives = (_int(by_name.get(W_REDRIVES)) or 0) + 1
        raw = [(k, v) for k, v in raw if k not in DLQ_HEADERS]
        by_name = {k: v.decode("utf-8", "replace") for k, v in raw}
    else:
        topic, partition, offset = read_topic, read_partition, read_offset
        timestamp = int(message.timestamp()[1])
        key = by_name.get(ORIGIN_ID) or fallback_key(topic, partition, offset)
    item = DeliveryItem(
        read_topic,
        read_partition,
        read_offset,
        topic,
        partition,
        offset,
        timestamp,
        kafka_key,
        value,
        raw,
        key,
        "",
        b"",
        state,
        redrives=redrives,
    )
    if is_marker(raw):  # a watermark marker of an output stream: no event, nothing to deliver
        item.final = "skipped"
        return item
    try:
        decoded = codec.decode(item.value)
    except DeserializationError as exc:
        item.final, item.reason, item.detail = "failed", exc.reason, str(exc)[:2000]
        return item
    item.event_type = decoded.event_type
    severity = decoded.data.get("severity")
    item.severity = severity if isinstance(severity, str) else None
    item.body = payload_json(
        build_payload(
            key,
            decoded.event_type,
            decoded.writer.version,
            (topic, partition, offset, timestamp),
            item.kafka_key,
            by_name,
            decoded.data,
        )
    )
    return item


def dead_letter_headers(
    item: DeliveryItem, dispatcher: str
) -> list[tuple[str, str | bytes | None]]:
    """A failed insight's dead-letter headers: reason, error, attempts, identity, originals."""
    last = item.last
    status = "" if last is None or last.status is None else str(last.status)
    headers: list[tuple[str, str | bytes | None]] = [
        *failure_headers(item.reason, item.error_text()),
        (ATTEMPTS, str(item.attempts).encode()),
        (W_NAME, dispatcher.encode()),
        (W_ID, item.key.encode()),
        (W_TOPIC, item.topic.encode()),
        (W_PARTITION, str(item.partition).encode()),
        (W_OFFSET, str(item.offset).encode()),
        (W_TIMESTAMP, str(item.timestamp).encode()),
        (W_STATUS, status.encode()),
    ]
    if item.redrives:
        headers.append((W_REDRIVES, str(item.redrives).encode()))
    headers.extend(item.headers)
    return headers
