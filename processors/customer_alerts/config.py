"""The customer_alerts processor as the platform sees it (``refold.processors`` entry point).

Complex event processing per customer over ``order_state.changes``: order_state's output
stream of ``OrderStatusChanged`` records, keyed by ``customer_id`` (so no re-keying), event time
``changed_at``. Processors chain: this one folds another's output. A customer who cancels twice
within an hour is an insight on ``customer_alerts.insights``. The pattern is in
``projection.py``.
"""

from __future__ import annotations

from refold.contracts.commerce import ORDER_CHANGES
from refold.contracts.processors import EventTime, ProcessorSpec

__all__ = ["CUSTOMER_ALERTS", "LATENESS_MS"]

# One minute: the disorder *within* each upstream stream (one commerce.orders partition, as
# order_state folds it in log order), which is what a producer that keeps each order's events
# in order leaves. Not the upstream's batch span: order_state writes watermark markers to
# order_state.changes (its TopicSpec's event_time_field), so lateness is judged per upstream
# stream, and the parallel tasks' interleaving of a batch's source partitions is no disorder
# (docs/event-time.md, "Across chains"). Before the markers this was 12 hours, and the demo's
# 5.8 hours of events produced no insight.
LATENESS_MS = 60_000

CUSTOMER_ALERTS = ProcessorSpec(
    name="customer_alerts",
    projection="refold.processors.customer_alerts.projection:build",
    topics=(ORDER_CHANGES.name,),
    key="customer_id",
    tables=("patterns",),
    aggregates=("insight_counts",),
    event_time=EventTime(field="changed_at", lateness_ms=LATENESS_MS),
    options="refold.processors.fold.patterns:PatternOptions",
    description="per customer: two cancellations within an hour (over order_state.changes)",
)
