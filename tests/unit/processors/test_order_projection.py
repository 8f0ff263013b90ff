import copy

import pytest

from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import fold_all
from refold.processors.fold.projection import EventRejectedError
from refold.processors.order_state.projection import OrderStateProjection

P = OrderStateProjection()


def placed(order_id="o1", lines=(("A", 2, 500),), currency="EUR"):
    return "OrderPlaced", {
        "event_id": "e",
        "order_id": order_id,
        "customer_id": "c1",
        "lines": [{"sku": s, "qty": q, "unit_price_minor": p} for s, q, p in lines],
        "currency": currency,
        "placed_at": 1000,
        "channel": "app",
        "coupon_code": None,
    }


def paid(amount, order_id="o1", currency="EUR"):
    return "OrderPaid", {
        "event_id": "e",
        "order_id": order_id,
        "amount_minor": amount,
        "currency": currency,
        "payment_method": "CARD",
        "paid_at": 2000,
    }


def shipped(order_id="o1"):
    return "OrderShipped", {
        "event_id": "e",
        "order_id": order_id,
        "carrier": "DHL",
        "tracking_number": "T",
        "shipped_at": 3000,
    }


def cancelled(order_id="o1"):
    return "OrderCancelled", {
        "event_id": "e",
        "order_id": order_id,
        "reason": "r",
        "cancelled_at": 4000,
    }


def fold(*events):
    state = None
    for event_type, event in events:
        state = P.apply(state, event_type, event)
    return state


def test_lifecycle_placed_edit_paid_shipped():
    added = (
        "OrderLineAdded",
        {
            "event_id": "e",
            "order_id": "o1",
            "sku": "B",
            "qty": 1,
            "unit_price_minor": 250,
            "added_at": 1500,
        },
    )
    removed = (
        "OrderLineRemoved",
        {"event_id": "e", "order_id": "o1", "sku": "A", "removed_at": 1600},
    )
    state = fold(placed(), added, removed, paid(250), shipped())
    assert state["status"] == "shipped"
    assert state["lines"] == {"B": {"qty": 1, "unit_price_minor": 250}}
    assert state["total_minor"] == 250
    assert state["paid_minor"] == 250
    assert state["items"] == 1
    assert state["events"] == 5
    assert state["updated_at"] == 3000
    assert P.contribution(state) == {"orders:shipped": 1, "revenue_minor:EUR": 250}


def test_apply_does_not_mutate_its_input():
    state = fold(placed())
    before = copy.deepcopy(state)
    P.apply(
        state,
        "OrderLineAdded",
        {
            "event_id": "e",
            "order_id": "o1",
            "sku": "A",
            "qty": 1,
            "unit_price_minor": 500,
            "added_at": 1,
        },
    )
    assert state == before


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ([shipped()], "unknown order"),
        ([placed(), placed()], "exists already"),
        ([placed(), shipped()], "not allowed for an order that is placed"),
        ([placed(), paid(999)], "totals 1000"),
        ([placed(), paid(1000, currency="USD")], "USD"),
        ([placed(), paid(1000), shipped(), cancelled()], "shipped"),
        ([placed(), cancelled(), paid(1000)], "cancelled"),
    ],
)
def test_rule_breaking_events_are_rejected(events, message):
    *good, bad = events
    state = fold(*good) if good else None
    with pytest.raises(EventRejectedError, match=message):
        P.apply(state, *bad)


def test_cancelled_orders_bring_no_revenue():
    state = fold(placed(), paid(1000), cancelled())
    assert P.contribution(state) == {"orders:cancelled": 1}


def test_simulated_stream_folds_with_few_rejections_and_consistent_totals():
    events = list(OrderSimulator(2000, seed=3))
    result = fold_all(P, events)
    assert len(result.states) == 2000
    assert sum(v for k, v in result.aggregate.items() if k.startswith("orders:")) == 2000
    assert 0 < len(result.rejected) < 40  # the simulator's anomalies, nothing else
    revenue = sum(
        s["paid_minor"] for s in result.states.values() if s["status"] in ("paid", "shipped")
    )
    assert revenue == sum(v for k, v in result.aggregate.items() if k.startswith("revenue"))
