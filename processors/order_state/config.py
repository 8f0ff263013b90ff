"""The order-state processor as the platform sees it: its spec and its options.

Registered through the ``refold.processors`` entry point (``pyproject.toml``), as any user's
processor is. Options come from ``REFOLD_ORDER_STATE__*`` variables.
"""

from __future__ import annotations

from refold.contracts.commerce import ORDER_CHANGES, ORDERS
from refold.contracts.processors import ProcessorOptions, ProcessorSpec

__all__ = ["ORDER_STATE", "OrderStateOptions"]


class OrderStateOptions(ProcessorOptions):
    """order_state's options: the common ones plus where its outputs go."""

    # Shipping notices (the processor's side effect; not produced while replay rebuilds).
    notifications_topic: str = "order_state.notifications"
    # Status changes, an output stream with a contract (OrderStatusChanged, keyed by
    # customer_id) that processors of customers fold; empty: not published.
    changes_topic: str = ORDER_CHANGES.name


ORDER_STATE = ProcessorSpec(
    name="order_state",
    projection="refold.processors.order_state.projection:build",
    topics=(ORDERS.name,),
    key="order_id",
    tables=("orders",),
    aggregates=("order_totals",),
    options="refold.processors.order_state.config:OrderStateOptions",
    description="one state per order; order counts by status and revenue by currency",
)
