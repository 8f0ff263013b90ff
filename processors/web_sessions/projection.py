"""The web_sessions fold: session windows with a gap, merged per key, closed by a timer.

Pure (see :mod:`refold.processors.fold.projection` and :mod:`refold.processors.fold.timers`). A
session's state keeps its open visits as ``[start, end, page views, searches, clicks]``, sorted and
merged: two events belong to one visit when less than the gap separates them. That clustering
depends only on the set of event times, never on their order, so both topics' events may
interleave in any way. ``due`` is the earliest open visit's end plus the gap; ``on_timer``
closes the visits the watermark has passed (no on-time event can join them any more), counts
them and emits each as a side effect.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from refold.contracts.processors import ProcessorOptions
from refold.processors.fold.eventtime import event_time_ms
from refold.processors.fold.projection import SideEffect, State
from refold.processors.fold.timers import TIMER_EVENT

__all__ = ["GAP_MS", "WebSessionsProjection", "build", "merge_visit"]

GAP_MS = 30 * 60_000  # the clickstream simulator's SESSION_TIMEOUT_MS splits sessions with it
_KIND = {"PageViewed": 2, "SearchPerformed": 3, "SearchResultClicked": 4}  # visit columns
Visit = list[int]  # [start, end, page_views, searches, clicks]


def merge_visit(visits: Sequence[Visit], at: int, column: int, gap_ms: int) -> list[Visit]:
    """The visits with one more event at ``at`` (counted in ``column``), merged by the gap."""
    new: Visit = [at, at, 0, 0, 0]
    new[column] = 1
    out: list[Visit] = []
    for visit in sorted([*visits, new]):
        if out and visit[0] - out[-1][1] < gap_ms:
            last = out[-1]
            out[-1] = [
                last[0],
                max(last[1], visit[1]),
                *(a + b for a, b in zip(last[2:], visit[2:], strict=True)),
            ]
        else:
            out.append(list(visit))
    return out


class WebSessionsProjection:
    """Visits per site session (table ``visits``), closed after ``gap_ms`` of inactivity."""

    name = "web_sessions"
    table = "visits"
    aggregate = "visit_totals"
    event_types = tuple(_KIND)

    def __init__(self, closed_topic: str = "web_sessions.closed", gap_ms: int = GAP_MS) -> None:
        self.closed_topic = closed_topic
        self.gap_ms = gap_ms

    @property
    def effect_topics(self) -> tuple[str, ...]:
        """Where closed visits go (created at start)."""
        return (self.closed_topic,)

    def key(self, event_type: str, event: Mapping[str, Any]) -> str:
        """Visits are per site session."""
        del event_type
        return str(event["session_id"])

    def apply(self, state: State | None, event_type: str, event: Mapping[str, Any]) -> State:
        """Add the event to its visit, merging visits it bridges."""
        current = state or {
            "session_id": str(event["session_id"]),
            "visitor_id": str(event["visitor_id"]),
            "open": [],
            "closed": 0,
            "closed_events": 0,
            "closed_ms": 0,
        }
        at = event_time_ms(event, "occurred_at")
        return {**current, "open": merge_visit(current["open"], at, _KIND[event_type], self.gap_ms)}

    def due(self, state: State) -> int | None:
        """The earliest open visit's end plus the gap."""
        return min((v[1] + self.gap_ms for v in state["open"]), default=None)

    def on_timer(self, state: State, watermark: int) -> State | None:
        """Close the visits whose end plus the gap the watermark has reached."""
        closing = [v for v in state["open"] if v[1] + self.gap_ms <= watermark]
        return {
            **state,
            "open": [v for v in state["open"] if v[1] + self.gap_ms > watermark],
            "closed": state["closed"] + len(closing),
            "closed_events": state["closed_events"] + sum(sum(v[2:]) for v in closing),
            "closed_ms": state["closed_ms"] + sum(v[1] - v[0] for v in closing),
        }

    def effects(
        self, event_type: str, event: Mapping[str, Any], before: State | None, after: State
    ) -> list[SideEffect]:
        """Each visit a timer closed, as a record on ``closed_topic``."""
        del event
        if event_type != TIMER_EVENT or before is None:
            return []
        still = {tuple(v) for v in after.get("open", [])}
        return [
            SideEffect(
                self.closed_topic,
                before["session_id"],
                {
                    "session_id": before["session_id"],
                    "visitor_id": before["visitor_id"],
                    "start": v[0],
                    "end": v[1],
                    "page_views": v[2],
                    "searches": v[3],
                    "clicks": v[4],
                },
            )
            for v in before["open"]
            if tuple(v) not in still
        ]

    def contribution(self, state: State) -> Mapping[str, int]:
        """Visits closed and open, and the closed ones' events and total length."""
        return {
            "visits": state["closed"] + len(state["open"]),
            "closed": state["closed"],
            "open": len(state["open"]),
            "closed_events": state["closed_events"],
            "closed_ms": state["closed_ms"],
        }


def build(options: ProcessorOptions) -> WebSessionsProjection:
    """The projection (the spec's ``projection`` factory)."""
    return WebSessionsProjection(
        closed_topic=getattr(options, "closed_topic", "web_sessions.closed")
    )
