"""Where an output record comes from: the headers every processor output carries (pure).

Every record a processor produces (dead letters, side outputs, output streams, insights, closed
windows) carries its origin in Kafka headers. Two of them make outputs usable downstream:

- ``refold.origin.id``: one id per output, the same in every run and replay of the producing
  processor. A webhook delivery sends it as its ``Idempotency-Key``.
- For outputs caused by a record (state changes, insights, also those an entity timer fires,
  which fire at a fixed record in log order), the id is
  ``<processor>|<topic>/<partition>@<offset>.<index>``: an ordered *stream* (the producing
  processor and the source partition it read) and a *sequence number* (the source offset and the
  output's index among that record's outputs). A stream's outputs are produced in sequence
  order, so a consumer keeps, per stream, the highest sequence it applied (its origin mark) and
  skips anything at or below it: a re-sent batch, or the overlap of a replay's cutover, changes
  nothing downstream. ``<processor>`` may carry ``#<slot>`` for a re-keyed processor, whose
  writer slots each produce their own ordered share of a source partition.

Ids of other outputs (closed windows: at least once, read them as upserts) have no ``@``: they
are ids, not sequence numbers, and are never deduplicated by mark.

The other headers say who sent an output (``refold.processor``, ``refold.generation``) and, on a
dead letter, why (``refold.reason``, ``refold.error``) and what the record's own headers were
(``refold.headers``: so ``refold dlq redrive`` sends the record back byte for byte). This
module owns every one of those names and builds them (:func:`origin_headers`,
:func:`dead_letter_headers`): consumers, tests and the webhook dispatcher read them byte for
byte.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import NamedTuple

import orjson

__all__ = [
    "DEAD_LETTER_ERROR",
    "DEAD_LETTER_REASON",
    "ORIGIN_GENERATION",
    "ORIGIN_ID",
    "ORIGIN_OFFSET",
    "ORIGIN_PARTITION",
    "ORIGIN_PROCESSOR",
    "ORIGIN_TOPIC",
    "RECORD_HEADERS",
    "Headers",
    "OriginSeq",
    "dead_letter_headers",
    "decode_record_headers",
    "encode_record_headers",
    "failure_headers",
    "origin_headers",
    "origin_id",
    "parse_origin_id",
    "sender_headers",
]

ORIGIN_TOPIC = "refold.origin.topic"
ORIGIN_PARTITION = "refold.origin.partition"
ORIGIN_OFFSET = "refold.origin.offset"
ORIGIN_ID = "refold.origin.id"
# Who sent the output (the sender, not the source: hence no ``origin`` in these names).
ORIGIN_PROCESSOR = "refold.processor"
ORIGIN_GENERATION = "refold.generation"
# Why a record is a dead letter: a short machine-friendly reason, and the error for people.
DEAD_LETTER_REASON = "refold.reason"
DEAD_LETTER_ERROR = "refold.error"
# A dead letter's record's own headers (:func:`encode_record_headers`); absent when the sender
# did not read them (a letter sent before refold kept them, or from a source of Spark rows).
RECORD_HEADERS = "refold.headers"
# Longest error text (bytes) kept in a dead letter's ``refold.error`` header.
_ERROR_HEADER_MAX = 2000

Headers = list[tuple[str, str | bytes | None]]
RecordHeaders = Sequence[tuple[str, str | bytes | None]]


class OriginSeq(NamedTuple):
    """An output's place in its ordered stream (see the module docstring)."""

    stream: str
    offset: int
    nth: int  # the output's index among its record's outputs

    @property
    def seq(self) -> tuple[int, int]:
        """The sequence number within the stream (ordered)."""
        return (self.offset, self.nth)


def origin_id(
    processor: str, topic: str, partition: int, offset: int, index: int, slot: int | None = None
) -> str:
    """The id of the ``index``-th output caused by record ``topic/partition@offset``."""
    producer = processor if slot is None else f"{processor}#{slot}"
    return f"{producer}|{topic}/{partition}@{offset}.{index}"


def parse_origin_id(value: str | bytes | None) -> OriginSeq | None:
    """The stream and sequence of an origin id, or ``None`` when it has none (not a record's)."""
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else value
    stream, at, seq = text.rpartition("@")
    offset, dot, index = seq.partition(".")
    if not at or not dot or not offset.isdigit() or not index.isdigit():
        return None
    return OriginSeq(stream, int(offset), int(index))


def sender_headers(processor: str, generation: int) -> Headers:
    """Who sent an output record: ``refold.processor`` and ``refold.generation``."""
    return [
        (ORIGIN_PROCESSOR, processor.encode()),
        (ORIGIN_GENERATION, str(generation).encode()),
    ]


def origin_headers(
    topic: str, partition: int, offset: int, processor: str, generation: int
) -> Headers:
    """Where an output record comes from (consumers deduplicate on these) and who sent it.

    Args:
        topic: The source record's topic.
        partition: Its partition.
        offset: Its offset.
        processor: The processor that sends the output.
        generation: Its generation.

    Returns:
        ``refold.origin.topic``, ``.partition``, ``.offset``, then :func:`sender_headers`
        (``refold.origin.id`` is not among them: the caller knows the output's index).
    """
    return [
        (ORIGIN_TOPIC, topic.encode()),
        (ORIGIN_PARTITION, str(partition).encode()),
        (ORIGIN_OFFSET, str(offset).encode()),
        *sender_headers(processor, generation),
    ]


def failure_headers(reason: str, detail: str) -> Headers:
    """Why a record is a dead letter: ``refold.reason`` and ``refold.error`` (cut to 2000 bytes).

    Args:
        reason: Short machine-friendly reason (``bad-magic``, ``bad-body``, ...).
        detail: The error, for people.
    """
    return [
        (DEAD_LETTER_REASON, reason.encode()),
        (DEAD_LETTER_ERROR, detail.encode()[:_ERROR_HEADER_MAX]),
    ]


def dead_letter_headers(
    reason: str,
    detail: str,
    origin: tuple[str, int, int],
    processor: str,
    generation: int,
) -> Headers:
    """The headers of a processor's dead letter: why (:func:`failure_headers`) and its origin.

    Args:
        reason: Short machine-friendly reason (``bad-magic``, ``bad-body``, ...).
        detail: The error, for people (cut to 2000 bytes).
        origin: ``(topic, partition, offset)`` of the record.
        processor: The processor that refused it.
        generation: Its generation.
    """
    return [*failure_headers(reason, detail), *origin_headers(*origin, processor, generation)]


def encode_record_headers(headers: RecordHeaders) -> bytes:
    """A record's headers as one header value: in order, duplicates kept, values exact.

    JSON: ``[[name, base64 value or null], ...]`` (``[]``: the record had none).
    """
    return orjson.dumps(
        [
            [name, None if value is None else base64.b64encode(_bytes(value)).decode()]
            for name, value in headers
        ]
    )


def decode_record_headers(raw: bytes | str) -> list[tuple[str, bytes | None]]:
    """The headers :func:`encode_record_headers` encoded, values as bytes.

    Raises:
        ValueError: ``raw`` is not such a value.
    """
    try:
        pairs = orjson.loads(raw)
        return [
            (str(n), None if v is None else base64.b64decode(v, validate=True)) for n, v in pairs
        ]
    except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
        msg = f"not a {RECORD_HEADERS} value: {exc}"
        raise ValueError(msg) from exc


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value
