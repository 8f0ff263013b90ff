"""Stream-table joins: each event enriched with another processor's table as of its event time.

Pure. A lookup processor (:class:`LookupFold`) names a table of another processor
(:class:`TableRef`), which keeps each entity's versions with the event time they became valid
(``{"versions": [[valid_from, value], ...]}``, see :func:`version_at`). Its events wait in a
pending set (written with the positions, exactly once) until the table processor's watermark
has passed their event time; then every version valid at that time is in the table (a version
older than the table's watermark would be late there, and is refused the same way in every
run), and :meth:`LookupFold.enrich` turns the event and the version into counter increments.
So which version an event sees never depends on how far the table processor had got when the
event arrived: live state and every rebuild agree (as Kafka Streams' versioned stores, read as
of the event's time).

The price: an event is joined only once the table's watermark passes it. A table whose
partitions go quiet holds its lookups back until its next events (or heartbeats).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from refold.processors.fold.projection import State

__all__ = [
    "PENDING_TIMERS",
    "LookupFold",
    "Pending",
    "TableRef",
    "decode_pending",
    "encode_pending",
    "version_at",
]


PENDING_TIMERS = "lookup"  # the timers (sorted set) of the events waiting for their lookup


@dataclass(frozen=True, slots=True)
class TableRef:
    """A table of another processor (read in its live generation)."""

    processor: str
    table: str


@dataclass(frozen=True, slots=True)
class Pending:
    """An event waiting for its lookup: its origin, type, event and event time."""

    topic: str
    partition: int
    offset: int
    event_type: str
    event: Mapping[str, Any]


class LookupFold(Protocol):
    """A processor whose events are counted with a row of another processor's table."""

    @property
    def name(self) -> str:
        """Processor name."""
        ...

    @property
    def event_types(self) -> tuple[str, ...]:
        """The event types it joins; the other types on its topics are passed by."""
        ...

    @property
    def aggregate(self) -> str:
        """The aggregate hash its increments go to."""
        ...

    @property
    def lookup(self) -> TableRef:
        """The table it reads."""
        ...

    def lookup_key(self, event_type: str, event: Mapping[str, Any]) -> str | None:
        """The table row the event needs (``None``: none, e.g. an anonymous visitor)."""
        ...

    def enrich(
        self, event_type: str, event: Mapping[str, Any], row: State | None, at: int
    ) -> Mapping[str, int]:
        """Counter increments for the event, given its table row (all versions) and time."""
        ...


def version_at(versions: Sequence[Sequence[Any]], at: int) -> Any:
    """The value of the latest version valid at ``at`` (``[valid_from, value]`` pairs)."""
    found = None
    for valid_from, value in versions:
        if valid_from <= at:
            found = value
        else:
            break
    return found


def encode_pending(pending: Pending) -> bytes:
    """A pending set member: unique per source record (re-adding it changes nothing)."""
    return orjson.dumps(
        [pending.topic, pending.partition, pending.offset, pending.event_type, pending.event],
        option=orjson.OPT_SORT_KEYS,
    )


def decode_pending(member: bytes | str) -> Pending:
    """Inverse of :func:`encode_pending`."""
    topic, partition, offset, event_type, event = orjson.loads(member)
    return Pending(str(topic), int(partition), int(offset), str(event_type), event)
