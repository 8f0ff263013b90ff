"""The order_alerts processor as the platform sees it (``refold.processors`` entry point).

Complex event processing per order on ``commerce.orders`` (keyed by ``order_id``, the topic's
partition key, so no re-keying): an order paid but neither shipped nor cancelled within 10
minutes, and an order cancelled within 10 minutes of its payment. Matches are insights on
``order_alerts.insights`` (the ``Insight`` contract). The patterns are in ``projection.py``.
"""

from __future__ import annotations

from refold.contracts.commerce import ORDERS
from refold.contracts.processors import EventTime, ProcessorSpec

__all__ = ["ORDER_ALERTS"]

ORDER_ALERTS = ProcessorSpec(
    name="order_alerts",
    projection="refold.processors.order_alerts.projection:build",
    topics=(ORDERS.name,),
    key="order_id",
    tables=("patterns",),
    aggregates=("insight_counts",),
    # Each order event carries its own time field. The order simulator ticks one clock for all
    # its events, so every partition is in event-time order (no disorder at all); one minute of
    # lateness is headroom for real producers (client clocks, retries). It is also the latency:
    # a match is found once a partition's newest event is a minute past it.
    event_time=EventTime(
        field="placed_at",
        by_type=(
            ("OrderLineAdded", "added_at"),
            ("OrderLineRemoved", "removed_at"),
            ("OrderPaid", "paid_at"),
            ("OrderShipped", "shipped_at"),
            ("OrderCancelled", "cancelled_at"),
        ),
        lateness_ms=60_000,
    ),
    options="refold.processors.fold.patterns:PatternOptions",
    description="per order: paid but not shipped within 10 min; paid then cancelled within 10 min",
)
