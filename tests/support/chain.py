"""What a chained processor must see: order_state's status changes, from a plain fold."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from processors.fold.projection import EventRejectedError, State, UnstorableStateError, fold_one
from processors.order_state.projection import OrderStateProjection, status_change


def status_changes(events: Iterable[tuple[str, dict[str, Any]]]) -> Counter[tuple[str, str]]:
    """(customer, status) -> how often an order of the customer moved to that status.

    The events in publishing order: each order's events are on one partition, so this is the
    order order_state folds them in.
    """
    projection = OrderStateProjection()
    states: dict[str, State] = {}
    out: Counter[tuple[str, str]] = Counter()
    for event_type, event in events:
        key = projection.key(event_type, event)
        try:
            new, *_rest = fold_one(projection, states.get(key), event_type, event)
        except (EventRejectedError, UnstorableStateError):
            continue  # rejected events change nothing (the oracle's rule)
        change = status_change(states.get(key), new)
        if change is not None:
            out[(change["customer_id"], change["status"])] += 1
        states[key] = new
    return out
