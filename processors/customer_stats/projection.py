"""The customer_stats fold: per customer, orders and spend, from order events and profiles.

Pure functions only (see :mod:`refold.processors.fold.projection`). Money is integer minor units.

A re-keyed entity sees each source partition's events in log order, but the interleaving of
different partitions (and topics) depends on micro-batch boundaries (DESIGN.md, re-keying).
So this fold combines its orders only in ways that do not depend on it: counts and sums, the
minimum and maximum of event times, and per-order sub-states that only that order's events
(one partition, in log order) change. Live state, the oracle and every replay agree exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refold.contracts.commerce import ORDERS
from refold.contracts.processors import ProcessorOptions
from refold.processors.fold.projection import EventRejectedError, State

__all__ = ["CustomerStatsProjection", "build"]

_ORDER_EVENTS = ORDERS.event_types
_PROFILE_FIELDS = ("email", "name", "country", "tier")


def _new(customer_id: str) -> State:
    return {
        "customer_id": customer_id,
        "orders": 0,
        "paid": 0,
        "shipped": 0,
        "cancelled": 0,
        "spend_minor": {},
        "largest_order_minor": 0,
        "first_order_at": None,
        "last_order_at": None,
        "open": {},
        "profile": None,
    }


class CustomerStatsProjection:
    """Folds order events (re-keyed by customer) and customer profiles (table ``customers``)."""

    name = "customer_stats"
    table = "customers"
    aggregate = "customer_totals"
    event_types = (*_ORDER_EVENTS, "CustomerRegistered", "ProfileChanged")

    def key(self, event_type: str, event: Mapping[str, Any]) -> str:
        """The customer (filled in by the platform's link for events without it)."""
        del event_type
        return str(event["customer_id"])

    def apply(self, state: State | None, event_type: str, event: Mapping[str, Any]) -> State:
        """Apply one event to one customer."""
        current = state or _new(str(event["customer_id"]))
        if event_type == "CustomerRegistered":
            if current["profile"] is not None:
                msg = f"customer {current['customer_id']} is registered already"
                raise EventRejectedError(msg)
            profile = {f: event[f] for f in _PROFILE_FIELDS}
            return {**current, "profile": profile, "registered_at": event["registered_at"]}
        if event_type == "ProfileChanged":
            if current["profile"] is None:
                msg = f"profile change for unregistered customer {current['customer_id']}"
                raise EventRejectedError(msg)
            changed = {f: event[f] for f in _PROFILE_FIELDS if event.get(f) is not None}
            return {**current, "profile": {**current["profile"], **changed}}
        return self._order_event(current, event_type, event)

    @staticmethod
    def _order_event(state: State, event_type: str, event: Mapping[str, Any]) -> State:
        order_id = str(event["order_id"])
        open_orders: dict[str, list[Any]] = state["open"]
        if event_type == "OrderPlaced":
            if order_id in open_orders:
                msg = f"order {order_id} was placed already"
                raise EventRejectedError(msg)
            at = event["placed_at"]
            first, last = state["first_order_at"], state["last_order_at"]
            return {
                **state,
                "orders": state["orders"] + 1,
                "first_order_at": at if first is None else min(first, at),
                "last_order_at": at if last is None else max(last, at),
                "open": {**open_orders, order_id: ["placed", 0, event["currency"]]},
            }
        entry = open_orders.get(order_id)
        if entry is None:
            msg = f"{event_type} for order {order_id}, which is not open for this customer"
            raise EventRejectedError(msg)
        status, paid_minor, currency = entry
        if event_type in ("OrderLineAdded", "OrderLineRemoved"):
            return state  # lines count in the order's payment
        rest = {k: v for k, v in open_orders.items() if k != order_id}
        spend = dict(state["spend_minor"])
        if event_type == "OrderPaid":
            if status != "placed":
                msg = f"order {order_id} is {status}, cannot be paid"
                raise EventRejectedError(msg)
            amount, currency = int(event["amount_minor"]), event["currency"]
            spend[currency] = spend.get(currency, 0) + amount
            return {
                **state,
                "paid": state["paid"] + 1,
                "spend_minor": spend,
                "largest_order_minor": max(state["largest_order_minor"], amount),
                "open": {**rest, order_id: ["paid", amount, currency]},
            }
        if event_type == "OrderShipped":
            if status != "paid":
                msg = f"order {order_id} is {status}, cannot be shipped"
                raise EventRejectedError(msg)
            return {**state, "shipped": state["shipped"] + 1, "open": rest}
        # OrderCancelled: a paid order is refunded.
        if paid_minor:
            spend[currency] = spend.get(currency, 0) - paid_minor
        return {
            **state,
            "cancelled": state["cancelled"] + 1,
            "spend_minor": {c: v for c, v in spend.items() if v},
            "open": rest,
        }

    def contribution(self, state: State) -> Mapping[str, int]:
        """Customers, orders by outcome and spend per currency, for the totals hash."""
        totals = {
            "customers": 1,
            "registered": int(state["profile"] is not None),
            "orders": state["orders"],
            "paid": state["paid"],
            "shipped": state["shipped"],
            "cancelled": state["cancelled"],
        }
        for currency, amount in state["spend_minor"].items():
            totals[f"spend_minor:{currency}"] = amount
        return totals


def build(options: ProcessorOptions) -> CustomerStatsProjection:
    """The projection (the spec's ``projection`` factory); it has no options of its own."""
    del options
    return CustomerStatsProjection()
