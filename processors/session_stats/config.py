"""The session_stats processor as the platform sees it (``refold.processors`` entry point).

It reads ``web.pageviews`` and ``web.searches``, both keyed by ``session_id`` with the same
partition count: they are co-partitioned, so the task of a partition id owns its sessions on
both topics (checked against the broker at start), and nothing is re-keyed.
"""

from __future__ import annotations

from refold.contracts.processors import ProcessorSpec
from refold.contracts.web import PAGEVIEWS, SEARCHES

__all__ = ["SESSION_STATS"]

SESSION_STATS = ProcessorSpec(
    name="session_stats",
    projection="refold.processors.session_stats.projection:build",
    topics=(PAGEVIEWS.name, SEARCHES.name),
    key="session_id",
    tables=("sessions",),
    aggregates=("session_totals",),
    description="per web session: page views, searches, clicks, first and last event time",
)
