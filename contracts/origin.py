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
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "ORIGIN_ID",
    "ORIGIN_OFFSET",
    "ORIGIN_PARTITION",
    "ORIGIN_TOPIC",
    "OriginSeq",
    "origin_id",
    "parse_origin_id",
]

ORIGIN_TOPIC = "refold.origin.topic"
ORIGIN_PARTITION = "refold.origin.partition"
ORIGIN_OFFSET = "refold.origin.offset"
ORIGIN_ID = "refold.origin.id"


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
