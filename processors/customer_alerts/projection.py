"""The customer_alerts fold: repeated cancellations per customer, on event time (pure).

Built from :class:`refold.processors.fold.patterns.PatternProjection`; every rule (buffering,
settling below the watermark, insight ids) is there.

Why two within an hour, not three: the order simulator spreads each customer's orders (three
on average: one customer per three orders) uniformly over the whole stream, and cancels ~9% of
orders. In the demo's 10,500 orders (seed 2026, ~5.8 hours of event time) no customer cancels
three times within an hour (two do within two hours), while 52 cancel twice within an hour.
"""

from __future__ import annotations

from refold.contracts.commerce import ORDER_CHANGES
from refold.contracts.processors import ProcessorOptions
from refold.processors.customer_alerts.config import CUSTOMER_ALERTS
from refold.processors.fold.patterns import CountWithin, On, PatternProjection

__all__ = ["PATTERNS", "WITHIN_MS", "build"]

WITHIN_MS = 3_600_000

PATTERNS = (
    # Counting starts over after a match: four cancellations within the hour are two insights,
    # three are one.
    CountWithin(
        "repeated_cancellations",
        on=On("OrderStatusChanged", status="cancelled"),
        count=2,
        within_ms=WITHIN_MS,
        description="two orders cancelled within an hour",
    ),
)


def build(options: ProcessorOptions) -> PatternProjection:
    """The fold (the spec's ``projection`` factory); options may move the insights topic."""
    return PatternProjection(
        CUSTOMER_ALERTS.name,
        key=CUSTOMER_ALERTS.key,
        event_types=ORDER_CHANGES.event_types,
        event_time=CUSTOMER_ALERTS.event_time,
        patterns=PATTERNS,
        table=CUSTOMER_ALERTS.tables[0],
        aggregate=CUSTOMER_ALERTS.aggregates[0],
        insights_topic=getattr(options, "insights_topic", None),
    )
