"""The customer_stats processor as the platform sees it (``refold.processors`` entry point).

Keyed by ``customer_id`` while ``commerce.orders`` is partitioned by ``order_id``: the platform
re-keys it (one writer per customer). ``OrderPaid``, ``OrderShipped`` and ``OrderCancelled``
carry no customer: the link ``order_id -> customer_id`` gives them the customer of their
order's ``OrderPlaced``. Profiles come from ``crm.customers``, keyed by ``customer_id``.
"""

from __future__ import annotations

from refold.contracts.commerce import ORDERS
from refold.contracts.processors import KeyLink, ProcessorSpec
from refold.contracts.web import CUSTOMERS

__all__ = ["CUSTOMER_STATS"]

CUSTOMER_STATS = ProcessorSpec(
    name="customer_stats",
    projection="refold.processors.customer_stats.projection:build",
    topics=(ORDERS.name, CUSTOMERS.name),
    key="customer_id",
    tables=("customers",),
    aggregates=("customer_totals",),
    key_links=(KeyLink(via="order_id", key="customer_id"),),
    description="per customer: orders, spend per currency, first/last order time, profile",
)
