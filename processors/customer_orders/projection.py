"""The customer_orders fold: each customer's orders by status, from order_state's changes (pure).

Every count only adds, so the state does not depend on the order in which the changes of
several source partitions interleave on a partition of ``order_state.changes``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refold.contracts.commerce import ORDER_CHANGES
from refold.contracts.processors import ProcessorOptions
from refold.processors.fold.projection import State

__all__ = ["CustomerOrdersProjection", "build"]


class CustomerOrdersProjection:
    """Per customer (table ``customers``): status changes by status, paid minor units by currency.

    ``entered[<status>]`` counts the customer's orders that reached the status (an order that
    was paid, then shipped, counts under both); ``paid_minor[<currency>]`` sums the totals of
    those paid. The aggregate counts every change by status.
    """

    name = "customer_orders"
    table = "customers"
    aggregate = "order_changes"
    event_types = ORDER_CHANGES.event_types

    def key(self, event_type: str, event: Mapping[str, Any]) -> str:
        """Keyed by the change's customer (the topic's partition key)."""
        del event_type
        return str(event["customer_id"])

    def apply(self, state: State | None, event_type: str, event: Mapping[str, Any]) -> State:
        """Count one status change."""
        del event_type
        current = state or {"customer_id": event["customer_id"], "entered": {}, "paid_minor": {}}
        entered = dict(current["entered"])
        entered[event["status"]] = entered.get(event["status"], 0) + 1
        paid = dict(current["paid_minor"])
        if event["status"] == "paid":
            paid[event["currency"]] = paid.get(event["currency"], 0) + event["total_minor"]
        return {**current, "entered": entered, "paid_minor": paid}

    def contribution(self, state: State) -> Mapping[str, int]:
        """Changes by status, summed over customers."""
        return {f"to:{status}": n for status, n in state["entered"].items()}


def build(options: ProcessorOptions) -> CustomerOrdersProjection:
    """The projection (the spec's ``projection`` factory)."""
    del options
    return CustomerOrdersProjection()
