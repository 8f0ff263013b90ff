"""The unique_visitors processor as the platform sees it (``refold.processors`` entry point).

It counts the distinct ``visitor_id`` s of ``web.pageviews`` per hour of event time, overall and
per device, in HyperLogLog sketches (PFADD is idempotent; PFCOUNT of several hours is the count
of their union: a day, or any range, on demand). Late page views are accepted: a sketch takes
a visitor once whenever it comes, and an hour that had closed is emitted again, corrected.
"""

from __future__ import annotations

from refold.contracts.processors import EventTime, ProcessorSpec
from refold.contracts.web import PAGEVIEWS

__all__ = ["UNIQUE_VISITORS"]

UNIQUE_VISITORS = ProcessorSpec(
    name="unique_visitors",
    projection="refold.processors.unique_visitors.projection:build",
    topics=(PAGEVIEWS.name,),
    key="session_id",
    tables=(),
    windows=("hourly",),
    event_time=EventTime(field="occurred_at", lateness_ms=60_000, late="accept"),
    description="distinct visitors per hour, overall and per device (HyperLogLog)",
)
