"""The web_sessions processor as the platform sees it: its spec and its options.

Session windows over ``web.pageviews`` and ``web.searches`` (co-partitioned by ``session_id``):
the events of one site session are split into visits wherever the visitor paused longer than
the gap. A visit closes, and is emitted, when the session's partition watermark passes its last
event plus the gap (an entity timer).
"""

from __future__ import annotations

from refold.contracts.processors import EventTime, ProcessorOptions, ProcessorSpec
from refold.contracts.web import PAGEVIEWS, SEARCHES

__all__ = ["WEB_SESSIONS", "WebSessionsOptions"]


class WebSessionsOptions(ProcessorOptions):
    """web_sessions' options: the common ones plus where closed visits go."""

    closed_topic: str = "web_sessions.closed"


WEB_SESSIONS = ProcessorSpec(
    name="web_sessions",
    projection="refold.processors.web_sessions.projection:build",
    topics=(PAGEVIEWS.name, SEARCHES.name),
    key="session_id",
    tables=("visits",),
    aggregates=("visit_totals",),
    # The clickstream delivers some events up to 15 min late: 10 min of lateness keeps most;
    # the later ones are dead-lettered (reason "late") rather than reopening a closed visit.
    event_time=EventTime(field="occurred_at", lateness_ms=10 * 60_000),
    options="refold.processors.web_sessions.config:WebSessionsOptions",
    description="session windows per site session (gap 30 min): visits, their length and events",
)
