"""The customer_orders processor as the platform sees it (``refold.processors`` entry point).

Processors chain: this one folds ``order_state.changes``, order_state's output stream of
``OrderStatusChanged`` records (Avro contract), keyed by ``customer_id``: the topic's partition
key, so it is not re-keyed (compare customer_stats, which reads the raw orders and must be).
order_state may send a change twice (a crash between its produce and its commit, a replay's
cutover); the origin ids on each record make every change count once here.
"""

from __future__ import annotations

from refold.contracts.commerce import ORDER_CHANGES
from refold.contracts.processors import ProcessorSpec

__all__ = ["CUSTOMER_ORDERS"]

CUSTOMER_ORDERS = ProcessorSpec(
    name="customer_orders",
    projection="refold.processors.customer_orders.projection:build",
    topics=(ORDER_CHANGES.name,),
    key="customer_id",
    tables=("customers",),
    aggregates=("order_changes",),
    description="per customer, from order_state's changes: orders by status, paid per currency",
)
