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

A table bounds each entity's versions with a :class:`VersionRetention` (:func:`add_version`): a
deterministic rule over the entity's own versions, applied by the fold, so it is written in the
table's transaction and every replay and the oracle keep the same versions. A row that lost old
versions says so (``"dropped"``), and :func:`as_of` answers :data:`EXPIRED` for a time before
its oldest kept version, rather than a wrong version or "not there yet".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import orjson

from refold.processors.fold.projection import State

__all__ = [
    "EXPIRED",
    "PENDING_TIMERS",
    "LookupFold",
    "Pending",
    "TableRef",
    "VersionRetention",
    "add_version",
    "as_of",
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


class _Expired:
    """What :func:`as_of` answers when retention dropped the version valid at a time."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "EXPIRED"


EXPIRED: Final = _Expired()


@dataclass(frozen=True, slots=True)
class VersionRetention:
    """How many versions a versioned table keeps per entity (see :func:`add_version`).

    Both bounds are judged on the entity's own versions when one is added, never on a clock or
    on other entities, so the same events keep the same versions in every run.

    Attributes:
        max_versions: At most this many versions per entity, the newest (at least 1).
        horizon_ms: Also drop a version superseded more than this long (event time) before the
            entity's newest version; the version valid at ``newest - horizon_ms`` is kept, so
            a read as of any time in the horizon is answered. ``None``: no horizon.
    """

    max_versions: int = 64
    horizon_ms: int | None = None

    def __post_init__(self) -> None:
        if self.max_versions < 1:
            msg = f"max_versions must be at least 1, not {self.max_versions}"
            raise ValueError(msg)
        if self.horizon_ms is not None and self.horizon_ms < 0:
            msg = f"horizon_ms must not be negative, not {self.horizon_ms}"
            raise ValueError(msg)


def add_version(
    row: Mapping[str, Any] | None, at: int, value: Any, retention: VersionRetention
) -> dict[str, Any]:
    """``row`` with a version valid from ``at``, and the versions ``retention`` drops gone.

    The row's other fields are kept; ``"dropped"`` counts the versions dropped so far (absent
    while none was), which is how :func:`as_of` knows a time before the oldest kept version
    is not "before the entity existed".

    Raises:
        ValueError: ``at`` is older than the row's newest version (versions are appended in
            valid-from order; the fold rejects such an event first).
    """
    old = [] if row is None else list(row.get("versions", ()))
    if old and at < old[-1][0]:
        msg = f"a version valid from {at} is older than the newest one ({old[-1][0]})"
        raise ValueError(msg)
    versions = [*old, [at, value]]
    first = 0
    if retention.horizon_ms is not None:
        cutoff = at - retention.horizon_ms
        while first < len(versions) - 1 and versions[first + 1][0] <= cutoff:
            first += 1  # superseded at or before the cutoff: no read in the horizon needs it
    first = max(first, len(versions) - retention.max_versions)
    updated = {**(row or {}), "versions": versions[first:]}
    dropped = int((row or {}).get("dropped", 0)) + first
    if dropped:
        updated["dropped"] = dropped
    return updated


def as_of(row: Mapping[str, Any] | None, at: int) -> Any:
    """The value of a versioned row valid at ``at``.

    ``None`` when there is no row or no version yet at ``at``; :data:`EXPIRED` when retention
    dropped the version that was valid then.
    """
    if row is None:
        return None
    versions = row["versions"]
    if row.get("dropped") and versions and at < versions[0][0]:
        return EXPIRED
    return version_at(versions, at)


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
