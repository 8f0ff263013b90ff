"""The session_stats fold: one state per web session, from page views, searches and clicks.

Pure functions only (see :mod:`refold.processors.fold.projection`). A session's events come from two
topics, whose interleaving depends on micro-batch boundaries, so the state only counts, takes
minimum and maximum event times, and keeps the session's customer (one per session).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refold.contracts.processors import ProcessorOptions
from refold.processors.fold.projection import State

__all__ = ["SessionStatsProjection", "build"]

_COUNTERS = {"PageViewed": "page_views", "SearchPerformed": "searches"}


class SessionStatsProjection:
    """Folds ``web.pageviews`` and ``web.searches`` into session states (table ``sessions``)."""

    name = "session_stats"
    table = "sessions"
    aggregate = "session_totals"
    event_types = ("PageViewed", "SearchPerformed", "SearchResultClicked")

    def key(self, event_type: str, event: Mapping[str, Any]) -> str:
        """Sessions are keyed by ``session_id``."""
        del event_type
        return str(event["session_id"])

    def apply(self, state: State | None, event_type: str, event: Mapping[str, Any]) -> State:
        """Count the event and widen the session's time span."""
        at = event["occurred_at"]
        current = state or {
            "session_id": event["session_id"],
            "visitor_id": event["visitor_id"],
            "customer_id": None,
            "page_views": 0,
            "searches": 0,
            "clicks": 0,
            "first_at": at,
            "last_at": at,
        }
        counter = _COUNTERS.get(event_type, "clicks")
        return {
            **current,
            "customer_id": current["customer_id"] or event.get("customer_id"),
            counter: current[counter] + 1,
            "first_at": min(current["first_at"], at),
            "last_at": max(current["last_at"], at),
        }

    def contribution(self, state: State) -> Mapping[str, int]:
        """Sessions, identified sessions and events by kind."""
        return {
            "sessions": 1,
            "identified": int(state["customer_id"] is not None),
            "page_views": state["page_views"],
            "searches": state["searches"],
            "clicks": state["clicks"],
        }


def build(options: ProcessorOptions) -> SessionStatsProjection:
    """The projection (the spec's ``projection`` factory); it has no options of its own."""
    del options
    return SessionStatsProjection()
