"""A fold whose state expires (``state_ttl``): pages per session, forgotten after a quiet spell.

Used in-process by the integration test and, through a site directory that registers
:data:`EXPIRING_PAGES` under ``refold.processors``, by the Spark test's processor processes.
"""

from __future__ import annotations

from refold.contracts.processors import EventTime, ProcessorSpec, StateTtl
from refold.contracts.web import PAGEVIEWS

NAME = "expiring_pages"
# Sessions of the clickstream simulator pause for minutes; its long gaps last longer.
TTL = StateTtl(after_ms=10 * 60_000)
EVENT_TIME = EventTime(field="occurred_at", lateness_ms=2 * 60_000)


class ExpiringPages:
    """Pages and the first/last page time of each session; the aggregate sums them."""

    name = NAME
    table = "sessions"
    aggregate = "page_totals"
    event_types = ("PageViewed",)

    def key(self, event_type, event):
        return str(event["session_id"])

    def apply(self, state, event_type, event):
        at = event["occurred_at"]
        at = at if isinstance(at, int) else int(at.timestamp() * 1000)
        if state is None:
            return {"pages": 1, "first": at, "last": at}
        return {
            "pages": state["pages"] + 1,
            "first": min(state["first"], at),
            "last": max(state["last"], at),
        }

    def contribution(self, state):
        return {"sessions": 1, "pages": state["pages"]}


def build(options) -> ExpiringPages:
    return ExpiringPages()


EXPIRING_PAGES = ProcessorSpec(
    name=NAME,
    projection="tests.support.expiring:build",
    topics=(PAGEVIEWS.name,),
    key="session_id",
    tables=("sessions",),
    aggregates=("page_totals",),
    event_time=EVENT_TIME,
    state_ttl=TTL,
)
