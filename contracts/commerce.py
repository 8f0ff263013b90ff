"""refold's reference commerce domain: order events on ``commerce.orders``.

Registered like any user's contracts, through the ``refold.contracts`` entry point.
"""

from __future__ import annotations

from contracts.catalog import SCHEMA_ROOT
from contracts.registry import ContractSet
from contracts.topics import TopicSpec

__all__ = ["COMMERCE", "ORDERS"]

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

COMMERCE = ContractSet(name="commerce", schemas=SCHEMA_ROOT / "commerce", topics=(ORDERS,))
