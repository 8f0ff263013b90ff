"""A re-keyed session window for tests: shopping sessions per customer over orders keyed by order.

``OrderPlaced`` carries the customer; ``OrderPaid`` takes it from its order's link
(``KeyLink(via="order_id", key="customer_id")``), so one customer's events come from every
partition of ``commerce.orders``. A session is the customer's orders and payments separated by
less than the gap (``merge_visit`` of web_sessions, which depends only on the set of times), and
a timer closes it once the watermark is a gap past its last event: the same fold as
web_sessions, keyed by a field that is not the partition key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refold.contracts.processors import EventTime
from refold.processors.fold.eventtime import event_time_ms
from refold.processors.fold.projection import SideEffect, State
from refold.processors.fold.timers import TIMER_EVENT
from refold.processors.web_sessions.projection import merge_visit

__all__ = ["CUSTOMER_SESSIONS_TIME", "CustomerSessions"]

# Orders and payments are on one clock: each event type's time field.
CUSTOMER_SESSIONS_TIME = EventTime(
    field="paid_at",
    lateness_ms=5 * 60_000,
    by_type=(("OrderPlaced", "placed_at"),),
)
_COLUMN = {"OrderPlaced": 2, "OrderPaid": 3}  # a visit: [start, end, placed, paid, 0]


class CustomerSessions:
    """Shopping sessions per customer (table ``sessions``), closed after ``gap_ms`` quiet."""

    name = "customer_sessions"
    table = "sessions"
    aggregate = "session_totals"
    event_types = tuple(_COLUMN)

    def __init__(self, closed_topic: str = "customer_sessions.closed", gap_ms: int = 0) -> None:
        self.closed_topic = closed_topic
        self.gap_ms = gap_ms or 20 * 60_000

    @property
    def effect_topics(self) -> tuple[str, ...]:
        """Where closed sessions go."""
        return (self.closed_topic,)

    def key(self, event_type: str, event: Mapping[str, Any]) -> str:
        """Sessions are per customer (filled in from the order's link on payments)."""
        del event_type
        return str(event["customer_id"])

    def apply(self, state: State | None, event_type: str, event: Mapping[str, Any]) -> State:
        """Add the event to its session, merging sessions it bridges."""
        current = state or {"customer_id": str(event["customer_id"]), "open": [], "closed": 0}
        at = event_time_ms(event, CUSTOMER_SESSIONS_TIME.field_of(event_type))
        return {
            **current,
            "open": merge_visit(current["open"], at, _COLUMN[event_type], self.gap_ms),
        }

    def due(self, state: State) -> int | None:
        """The earliest open session's end plus the gap."""
        return min((v[1] + self.gap_ms for v in state["open"]), default=None)

    def on_timer(self, state: State, watermark: int) -> State | None:
        """Close the sessions whose end plus the gap the watermark has reached."""
        closing = [v for v in state["open"] if v[1] + self.gap_ms <= watermark]
        return {
            **state,
            "open": [v for v in state["open"] if v[1] + self.gap_ms > watermark],
            "closed": state["closed"] + len(closing),
        }

    def effects(
        self, event_type: str, event: Mapping[str, Any], before: State | None, after: State
    ) -> list[SideEffect]:
        """Each session a timer closed, on ``closed_topic``."""
        del event
        if event_type != TIMER_EVENT or before is None:
            return []
        still = {tuple(v) for v in after.get("open", [])}
        return [
            SideEffect(
                self.closed_topic,
                before["customer_id"],
                {
                    "customer_id": before["customer_id"],
                    "start": v[0],
                    "end": v[1],
                    "events": v[2] + v[3],
                },
            )
            for v in before["open"]
            if tuple(v) not in still
        ]

    def contribution(self, state: State) -> Mapping[str, int]:
        """Sessions closed and open."""
        return {"closed": state["closed"], "open": len(state["open"])}
