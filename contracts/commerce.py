"""refold's reference commerce domain: order events on ``commerce.orders``.

Registered like any user's contracts, through the ``refold.contracts`` entry point.
"""

from __future__ import annotations

from refold.contracts.catalog import SCHEMA_ROOT
from refold.contracts.registry import ContractSet
from refold.contracts.topics import TopicSpec

__all__ = ["COMMERCE", "ORDERS", "ORDER_CHANGES"]

# 8 partitions: enough parallelism for a few processor tasks, few enough for 2-core machines.
ORDERS = TopicSpec(
    name="commerce.orders",
    partitions=8,
    key_field="order_id",
    event_types=(
        "OrderPlaced",
        "OrderLineAdded",
        "OrderLineRemoved",
        "OrderPaid",
        "OrderShipped",
        "OrderCancelled",
    ),
)

# order_state's output stream (processors chain): status changes keyed by customer_id, the
# partition key a processor of customers needs. Written by order_state, never by producers;
# with watermark markers in its ``changed_at`` (docs/event-time.md, "Across chains").
ORDER_CHANGES = TopicSpec(
    name="order_state.changes",
    partitions=8,
    key_field="customer_id",
    event_types=("OrderStatusChanged",),
    event_time_field="changed_at",
)

COMMERCE = ContractSet(
    name="commerce", schemas=SCHEMA_ROOT / "commerce", topics=(ORDERS, ORDER_CHANGES)
)
