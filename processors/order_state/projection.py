"""The order-state fold: one state per order, and counters by status and revenue by currency.

Pure functions only (see :mod:`refold.processors.fold.projection`). Money is integer minor units.

Lifecycle: ``placed`` -> (lines added/removed) -> ``paid`` -> ``shipped``; ``placed`` or
``paid`` -> ``cancelled``. Anything else is rejected and dead-lettered with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from refold.contracts.commerce import ORDER_CHANGES, ORDERS
from refold.processors.fold.projection import EventRejectedError, SideEffect, State

if TYPE_CHECKING:
    from refold.processors.order_state.config import OrderStateOptions

__all__ = [
    "DEFAULT_CHANGES_TOPIC",
    "DEFAULT_NOTIFICATIONS_TOPIC",
    "OrderStateProjection",
    "build",
    "status_change",
]


def status_change(before: State | None, after: State) -> dict[str, Any] | None:
    """The ``OrderStatusChanged`` record of one applied event, or ``None`` (same status)."""
    previous = None if before is None else before["status"]
    if previous == after["status"]:
        return None
    return {
        "order_id": after["order_id"],
        "customer_id": after["customer_id"],
        "status": after["status"],
        "previous_status": previous,
        "currency": after["currency"],
        "total_minor": after["total_minor"],
        "changed_at": after["updated_at"],
    }


_OPEN = "placed"
_REVENUE_STATUSES = frozenset({"paid", "shipped"})


def _reject(reason: str) -> EventRejectedError:
    return EventRejectedError(reason)


def _with_lines(
    state: State, lines: dict[str, dict[str, int]], items: int, total_minor: int, at: int
) -> State:
    # Line dicts are never changed once built: a new state shares the unchanged ones.
    return {
        **state,
        "lines": lines,
        "items": items,
        "total_minor": total_minor,
        "updated_at": at,
        "events": state["events"] + 1,
    }


DEFAULT_NOTIFICATIONS_TOPIC = "order_state.notifications"
DEFAULT_CHANGES_TOPIC = ORDER_CHANGES.name


class OrderStateProjection:
    """Folds ``commerce.orders`` events into order states (table ``orders``).

    Outputs (not re-sent while ``replay`` rebuilds a generation):

    - when an order becomes ``shipped``, a shipping notice for the customer goes to
      ``notifications_topic`` (JSON);
    - with a ``changes_topic``, every status change goes there as an ``OrderStatusChanged``
      record (Avro contract) keyed by ``customer_id``: an output stream another processor folds
      (``customer_alerts`` does), exactly once by its origin ids.

    Args:
        notifications_topic: Output topic of the shipping notices.
        changes_topic: Output stream of status changes; ``None`` (the default here; the
            processor's options turn it on): none.
    """

    def __init__(
        self,
        notifications_topic: str = DEFAULT_NOTIFICATIONS_TOPIC,
        changes_topic: str | None = None,
    ) -> None:
        self.notifications_topic = notifications_topic
        self.changes_topic = changes_topic or None

    @property
    def effect_topics(self) -> tuple[str, ...]:
        """Topics the side effects go to."""
        changes = () if self.changes_topic is None else (self.changes_topic,)
        return (self.notifications_topic, *changes)

    def effects(
        self, event_type: str, event: Mapping[str, Any], before: State | None, after: State
    ) -> Iterable[SideEffect]:
        """A status change record, and a shipping notice when an order becomes shipped."""
        del event_type, event  # the states say it all
        out: list[SideEffect] = []
        if self.changes_topic is not None:
            change = status_change(before, after)
            if change is not None:
                out.append(
                    SideEffect(
                        self.changes_topic, after["customer_id"], change, "OrderStatusChanged"
                    )
                )
        if after["status"] != "shipped" or (before is not None and before["status"] == "shipped"):
            return out
        notice = {
            "type": "order-shipped",
            "order_id": after["order_id"],
            "customer_id": after["customer_id"],
            "carrier": after.get("carrier"),
            "total_minor": after["total_minor"],
            "currency": after["currency"],
            "shipped_at": after["updated_at"],
        }
        return [*out, SideEffect(self.notifications_topic, after["order_id"], notice)]

    name = "order_state"
    table = "orders"
    aggregate = "order_totals"
    event_types = ORDERS.event_types

    def key(self, event_type: str, event: Mapping[str, Any]) -> str:
        """Orders are keyed by ``order_id``."""
        return str(event["order_id"])

    def apply(self, state: State | None, event_type: str, event: Mapping[str, Any]) -> State:
        """Apply one event to one order (see the module docstring for the rules)."""
        if event_type == "OrderPlaced":
            return self._placed(state, event)
        if state is None:
            msg = f"{event_type} for unknown order {event['order_id']}"
            raise _reject(msg)
        status = state["status"]
        if event_type == "OrderLineAdded":
            self._require(status == _OPEN, event_type, status)
            lines = dict(state["lines"])
            old = lines.get(event["sku"])
            qty = event["qty"] + (old["qty"] if old is not None else 0)
            line = lines[event["sku"]] = {"qty": qty, "unit_price_minor": event["unit_price_minor"]}
            # Re-pricing a line re-prices its earlier quantity too (the line total is qty x price).
            old_total = old["qty"] * old["unit_price_minor"] if old is not None else 0
            return _with_lines(
                state,
                lines,
                state["items"] + event["qty"],
                state["total_minor"] - old_total + qty * line["unit_price_minor"],
                event["added_at"],
            )
        if event_type == "OrderLineRemoved":
            self._require(status == _OPEN, event_type, status)
            if event["sku"] not in state["lines"]:
                msg = f"OrderLineRemoved: order {state['order_id']} has no line {event['sku']}"
                raise _reject(msg)
            lines = dict(state["lines"])
            gone = lines.pop(event["sku"])
            return _with_lines(
                state,
                lines,
                state["items"] - gone["qty"],
                state["total_minor"] - gone["qty"] * gone["unit_price_minor"],
                event["removed_at"],
            )
        if event_type == "OrderPaid":
            self._require(status == _OPEN, event_type, status)
            if (
                event["currency"] != state["currency"]
                or event["amount_minor"] != state["total_minor"]
            ):
                msg = (
                    f"OrderPaid: paid {event['amount_minor']} {event['currency']} but order "
                    f"{state['order_id']} totals {state['total_minor']} {state['currency']}"
                )
                raise _reject(msg)
            return self._moved(
                state,
                "paid",
                event["paid_at"],
                paid_minor=event["amount_minor"],
                payment_method=event["payment_method"],
            )
        if event_type == "OrderShipped":
            self._require(status == "paid", event_type, status)
            return self._moved(state, "shipped", event["shipped_at"], carrier=event["carrier"])
        if event_type == "OrderCancelled":
            self._require(status in (_OPEN, "paid"), event_type, status)
            return self._moved(
                state, "cancelled", event["cancelled_at"], cancel_reason=event["reason"]
            )
        msg = f"order_state does not fold {event_type}"
        raise _reject(msg)

    def contribution(self, state: State) -> Mapping[str, int]:
        """One order counts once under its status; paid and shipped orders add revenue."""
        result = {f"orders:{state['status']}": 1}
        if state["status"] in _REVENUE_STATUSES:
            result[f"revenue_minor:{state['currency']}"] = state["paid_minor"]
        return result

    @staticmethod
    def _require(ok: bool, event_type: str, status: str) -> None:
        if not ok:
            msg = f"{event_type} not allowed for an order that is {status}"
            raise _reject(msg)

    @staticmethod
    def _placed(state: State | None, event: Mapping[str, Any]) -> State:
        if state is not None:
            msg = f"OrderPlaced: order {event['order_id']} exists already"
            raise _reject(msg)
        lines: dict[str, dict[str, int]] = {}
        for line in event["lines"]:
            merged = lines.setdefault(line["sku"], {"qty": 0, "unit_price_minor": 0})
            merged["qty"] += line["qty"]
            merged["unit_price_minor"] = line["unit_price_minor"]
        base: State = {
            "order_id": event["order_id"],
            "customer_id": event["customer_id"],
            "status": _OPEN,
            "currency": event["currency"],
            "channel": event.get("channel", "web"),
            "placed_at": event["placed_at"],
            "paid_minor": 0,
            "events": 0,
        }
        return _with_lines(
            base,
            lines,
            sum(line["qty"] for line in lines.values()),
            sum(line["qty"] * line["unit_price_minor"] for line in lines.values()),
            event["placed_at"],
        )

    @staticmethod
    def _moved(state: State, status: str, at: int, **changes: Any) -> State:
        return {
            **state,
            **changes,
            "status": status,
            "updated_at": at,
            "events": state["events"] + 1,
        }


def build(options: OrderStateOptions) -> OrderStateProjection:
    """The projection for a run with ``options`` (the spec's ``projection`` factory)."""
    return OrderStateProjection(options.notifications_topic, options.changes_topic)
