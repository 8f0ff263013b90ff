"""The order_alerts fold: two patterns per order, matched on event time (pure).

Built from :class:`refold.processors.fold.patterns.PatternProjection`; every rule (buffering,
settling below the watermark, insight ids) is there.

Why 10 minutes: the order simulator ticks 1-400 ms per event (200 ms on average) over ~500
interleaved carts, so an order's next event comes ~100 s later on average. From payment to
shipping, the demo's orders (10,500, seed 2026) take 74 s at the median, 327 s at p95 and at
most ~17 min: 10 minutes flags about 0.5% of paid orders (~50 insights), the tail a warehouse
would chase. About 5% of paid orders are refunded instead, nearly all within 10 minutes (~430).
"""

from __future__ import annotations

from refold.contracts.commerce import ORDERS
from refold.contracts.processors import ProcessorOptions
from refold.processors.fold.patterns import Absence, On, PatternProjection, Sequence
from refold.processors.order_alerts.config import ORDER_ALERTS

__all__ = ["PATTERNS", "WITHIN_MS", "build"]

WITHIN_MS = 10 * 60_000

PATTERNS = (
    # An order paid but neither shipped nor cancelled within 10 minutes (event time): fired
    # once the watermark is past the payment plus 10 minutes.
    Absence(
        "paid_not_shipped",
        after=On("OrderPaid"),
        expect=(On("OrderShipped"), On("OrderCancelled")),
        within_ms=WITHIN_MS,
        description="paid but neither shipped nor cancelled within 10 minutes",
    ),
    # A payment refunded within 10 minutes: worth a look, not a page.
    Sequence(
        "paid_then_cancelled",
        steps=(On("OrderPaid"), On("OrderCancelled")),
        within_ms=WITHIN_MS,
        severity="warning",
        description="cancelled within 10 minutes of its payment",
    ),
)


def build(options: ProcessorOptions) -> PatternProjection:
    """The fold (the spec's ``projection`` factory); options may move the insights topic."""
    return PatternProjection(
        ORDER_ALERTS.name,
        key=ORDER_ALERTS.key,
        event_types=ORDERS.event_types,  # all of them: the others move the watermark
        event_time=ORDER_ALERTS.event_time,
        patterns=PATTERNS,
        table=ORDER_ALERTS.tables[0],
        aggregate=ORDER_ALERTS.aggregates[0],
        insights_topic=getattr(options, "insights_topic", None),
    )
