"""The sales_windows processor as the platform sees it (``refold.processors`` entry point).

It counts ``OrderPaid`` events of ``commerce.orders`` into windows per currency. The currency is
not the partition key (``order_id``): the buckets are additive, so each partition's task adds to
them under its own partition's guard, and nothing is re-keyed. Its key is the partition key.
"""

from __future__ import annotations

from refold.contracts.commerce import ORDERS
from refold.contracts.processors import EventTime, ProcessorSpec

__all__ = ["SALES_WINDOWS"]

SALES_WINDOWS = ProcessorSpec(
    name="sales_windows",
    projection="refold.processors.sales_windows.projection:build",
    topics=(ORDERS.name,),
    key="order_id",
    tables=(),
    windows=("per_minute", "five_minutes_hopping", "five_minutes_sliding"),
    # Payments arrive in order per order, and orders interleave within seconds: 30 s of
    # lateness is generous; later payments are dead-lettered (reason "late").
    event_time=EventTime(field="paid_at", lateness_ms=30_000, retention_ms=24 * 3_600_000),
    description="paid sales per currency: per minute, 5 min hopping by 1 min, 5 min sliding",
)
