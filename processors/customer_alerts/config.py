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

# 12 hours. The lateness must cover the disorder of the input, and this input's disorder is
# made upstream: order_state folds a micro-batch's source partitions in parallel tasks, each
# producing the status changes of its partitions as it folds them, so on one partition of
# order_state.changes the changes of a batch interleave by source partition, and an event may
# follow others up to the batch's whole event-time span. During a catch-up that span is
# order_state's batch size times the event pace: its default 200,000 records at the order
# simulator's ~0.2 s per event is ~11 hours. A smaller lateness would dead-letter (reason
# "late") the changes of whole source partitions after a restart or a replay of order_state:
# deterministically (live, oracle and replay agree), but lost to the pattern. The price is the
# latency: a match is found once the watermark is 12 hours of event time past it. With
# smaller upstream batches (order_state's max_offsets_per_trigger), lower it to their span.
LATENESS_MS = 12 * 3_600_000

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
