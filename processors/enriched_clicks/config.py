"""The enriched_clicks processor as the platform sees it (``refold.processors`` entry point).

A stream-table join: each ``SearchResultClicked`` of ``web.searches`` is enriched with the
profile its customer had at the click's event time, read from customer_profiles' versioned
table once that processor's watermark has passed the click, and counted per customer tier and
country (anonymous clicks apart).
"""

from __future__ import annotations

from refold.contracts.processors import EventTime, ProcessorSpec
from refold.contracts.web import SEARCHES

__all__ = ["ENRICHED_CLICKS"]

ENRICHED_CLICKS = ProcessorSpec(
    name="enriched_clicks",
    projection="refold.processors.enriched_clicks.projection:build",
    topics=(SEARCHES.name,),
    key="session_id",
    tables=(),
    aggregates=("clicks_by_customer",),
    event_time=EventTime(field="occurred_at", lateness_ms=5 * 60_000),
    description="clicks joined with the customer's profile as of the click (stream-table)",
)
