"""Event time, deterministically: per-partition clocks, lateness and the processor's watermark.

Pure (DESIGN.md decision 11). Each source partition has a clock: the largest event time seen on
it, in log order. A record is *late* when its event time is below its partition's watermark
(the clock before it minus the allowed lateness), so whether a record is late depends only on
the records before it on its partition, never on micro-batch boundaries: live processing and
every replay decide alike. The clocks are stored with the applied positions, in the same
transaction.

The processor's watermark is the minimum over its partitions' watermarks, none until every
partition has seen an event (:func:`refold.contracts.windows.watermark_of`); windows close, and
lookups join, when it passes them. Entity timers fire on their partition group's watermark
(:mod:`refold.processors.fold.timers`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from enum import Enum
from typing import Any

from refold.contracts.processors import EventTime
from refold.processors.fold.projection import EventRejectedError

__all__ = ["PartitionClocks", "Verdict", "event_time_ms", "is_folded"]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MS = dt.timedelta(milliseconds=1)


class Verdict(Enum):
    """What the clocks say about one record."""

    ON_TIME = "on-time"
    LATE = "late"
    EXPIRED = "expired"  # late beyond the retention: its buckets may be gone


def event_time_ms(event: Mapping[str, Any], field: str) -> int:
    """The event time of ``event`` in epoch milliseconds (exact: no float on the way).

    Raises:
        EventRejectedError: The field is missing or not a time (the record is dead-lettered).
    """
    value = event.get(field)
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
        return (aware - _EPOCH) // _MS
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    msg = f"event time field {field!r} is {value!r}, not a timestamp"
    raise EventRejectedError(msg)


class PartitionClocks:
    """The clocks of the partitions of one transaction, advanced record by record.

    Args:
        event_time: The processor's event-time settings.
        stored: Clocks as stored (``topic/partition`` -> largest event time seen).
    """

    def __init__(self, event_time: EventTime, stored: Mapping[str, int]) -> None:
        self.event_time = event_time
        self.clocks = dict(stored)
        self.changed: dict[str, int] = {}

    def observe(self, field: str, at: int) -> Verdict:
        """Judge a record of partition ``field`` with event time ``at``, then advance its clock."""
        clock = self.clocks.get(field)
        verdict = Verdict.ON_TIME
        if clock is not None:
            watermark = clock - self.event_time.lateness_ms
            if at < watermark:
                verdict = (
                    Verdict.EXPIRED
                    if at < watermark - self.event_time.retention_ms
                    else Verdict.LATE
                )
        if clock is None or at > clock:
            self.clocks[field] = self.changed[field] = at
        return verdict


def is_folded(verdict: Verdict, event_time: EventTime) -> bool:
    """Whether a record with this verdict is folded: on time, or late and accepted (not expired)."""
    return verdict is Verdict.ON_TIME or (verdict is Verdict.LATE and event_time.late == "accept")
