"""Property tests of the order-state fold: malformed events are rejected with a reason, never raise.

The events start as a simulator stream and are then mutated: fields dropped, set to None or to
the wrong type, huge or negative numbers, unknown skus and orders, duplicates, unknown types.
Derandomized and without an example database, so CI runs the same examples every time.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import fold_all
from refold.processors.fold.projection import (
    EventRejectedError,
    State,
    UnstorableStateError,
    fold_one,
    store_state,
)
from refold.processors.order_state.projection import OrderStateProjection

P = OrderStateProjection()
# A few hundred sequences of ~5-60 events each keep the file at a few seconds.
FUZZ = settings(max_examples=250, derandomize=True, database=None, deadline=None)

Event = tuple[str, dict[str, Any]]

HUGE = st.sampled_from([2**31, 2**62, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, -(2**64)])
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    HUGE,
    st.floats(allow_nan=False),  # NaN != NaN would defeat the "not mutated" checks
    st.text(max_size=6),
    st.binary(max_size=4),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
FIELDS = sorted(
    {
        "event_id",
        "order_id",
        "customer_id",
        "lines",
        "currency",
        "placed_at",
        "channel",
        "sku",
        "qty",
        "unit_price_minor",
        "added_at",
        "removed_at",
        "amount_minor",
        "payment_method",
        "paid_at",
        "carrier",
        "shipped_at",
        "reason",
        "cancelled_at",
    }
)
TYPES = st.sampled_from([*P.event_types, "OrderRefunded"])


def _mutate_number(value: Any, draw: st.DrawFn) -> Any:
    negated = -value if isinstance(value, int) and value else -1
    return draw(st.one_of(HUGE, st.integers(-1000, -1), st.just(negated), JUNK))


def _lines(event: dict[str, Any]) -> list[dict[str, Any]]:
    lines = event.get("lines")
    if not isinstance(lines, list):
        return []
    return [line for line in lines if isinstance(line, dict) and line]


def mutate(draw: st.DrawFn, event_type: str, event: dict[str, Any]) -> list[Event]:
    """One mutation of one event: zero, one or two events take its place."""
    kind = draw(
        st.sampled_from(
            [
                "drop-field",
                "junk-field",
                "number",
                "line",
                "unknown-sku",
                "unknown-order",
                "duplicate",
                "retype",
                "drop-event",
            ]
        )
    )
    event = copy.deepcopy(event)
    name = draw(st.sampled_from(sorted(event)))
    if kind == "drop-field":
        del event[name]
    elif kind == "junk-field":
        event[name] = draw(JUNK)
    elif kind == "number":
        numbers = sorted(k for k, v in event.items() if isinstance(v, int))
        if numbers:
            field = draw(st.sampled_from(numbers))
            event[field] = _mutate_number(event[field], draw)
    elif kind == "line" and _lines(event):
        line = draw(st.sampled_from(_lines(event)))
        field = draw(st.sampled_from(sorted(line)))
        action = draw(st.sampled_from(["drop", "junk", "number"]))
        if action == "drop":
            del line[field]
        elif action == "junk":
            line[field] = draw(JUNK)
        else:
            line[field] = _mutate_number(line[field], draw)
    elif kind == "unknown-sku":
        event["sku"] = draw(st.sampled_from(["SKU-NONE", "", None]))
    elif kind == "unknown-order":
        event["order_id"] = draw(st.sampled_from(["ord-unknown", "", None, 7]))
    elif kind == "duplicate":
        return [(event_type, event), (event_type, copy.deepcopy(event))]
    elif kind == "retype":
        return [(draw(TYPES), event)]
    elif kind == "drop-event":
        return []
    return [(event_type, event)]


@st.composite
def random_events(draw: st.DrawFn) -> Event:
    """An event made up from scratch: a known or unknown type with some junk fields."""
    fields = draw(st.dictionaries(st.sampled_from(FIELDS), JUNK, max_size=8))
    if draw(st.booleans()):
        fields["order_id"] = draw(st.sampled_from(["ord-0000001", "ord-0000002", "x"]))
    return draw(TYPES), fields


@st.composite
def event_sequences(draw: st.DrawFn) -> list[Event]:
    """A simulator stream (anomalies included), mutated, with made-up events mixed in."""
    seed = draw(st.integers(0, 10_000))
    orders = draw(st.integers(1, 6))
    events: list[Event] = list(OrderSimulator(orders, seed=seed, anomaly_rate=0.2, concurrency=3))
    for _ in range(draw(st.integers(0, 6))):
        if not events:
            break
        at = draw(st.integers(0, len(events) - 1))
        events[at : at + 1] = mutate(draw, *events[at])
    for extra in draw(st.lists(random_events(), max_size=4)):
        events.insert(draw(st.integers(0, len(events))), extra)
    return events


def _applied(states: Mapping[str, State]) -> int:
    return sum(state["events"] for state in states.values())


@FUZZ
@given(event_sequences())
def test_fold_all_accounts_for_every_event(events):
    result = fold_all(P, events)
    # Every event was applied (counted in its order's state), rejected with a reason, or
    # passed by (a type the fold does not declare).
    assert _applied(result.states) + len(result.rejected) + result.passed == len(events)
    for _event_id, reason in result.rejected:
        assert isinstance(reason, str)
        assert reason
    for state in result.states.values():
        store_state(P, state)  # what the fold kept can be stored


@FUZZ
@given(event_sequences())
def test_fold_one_raises_only_rejections_and_never_mutates(events):
    states: dict[str, State] = {}
    rejected = passed = 0
    for event_type, event in events:
        if event_type not in P.event_types:  # passed by, before anything else
            passed += 1
            continue
        try:
            key = str(P.key(event_type, event))
        except KeyError:  # fold_all refuses a record without a key before folding it
            rejected += 1
            continue
        before = states.get(key)
        before_copy, event_copy = copy.deepcopy(before), copy.deepcopy(event)
        error: EventRejectedError | UnstorableStateError | None = None
        try:
            new, _encoded, _contribution, _effects = fold_one(P, before, event_type, event)
        except (EventRejectedError, UnstorableStateError) as exc:  # FoldError is a rejection
            error = exc
        if error is None:
            states[key] = new
        else:
            rejected += 1
            assert str(error)
            if isinstance(error, UnstorableStateError):
                assert error.reason in {"unserialisable", "overflow"}
        assert before == before_copy, "the fold changed the state it was given"
        assert event == event_copy, "the fold changed its event"
    result = fold_all(P, events)
    assert (states, rejected, passed) == (result.states, len(result.rejected), result.passed)


def _placed(order_id: str, qty: int, price: int) -> Event:
    return "OrderPlaced", {
        "event_id": f"e-{order_id}",
        "order_id": order_id,
        "customer_id": "c1",
        "lines": [{"sku": "SKU-1", "qty": qty, "unit_price_minor": price}],
        "currency": "EUR",
        "placed_at": 1,
        "channel": "web",
        "coupon_code": None,
    }


def test_a_total_beyond_64_bits_is_unserialisable_and_the_others_fold_normally():
    normal = list(OrderSimulator(40, seed=4, anomaly_rate=0, concurrency=5))
    huge = _placed("ord-huge", 4, 2**62)  # total 2**64: beyond what JSON in Redis may hold
    events = [*normal[:30], huge, *normal[30:]]

    result = fold_all(P, events)

    assert [event_id for event_id, _reason in result.rejected] == ["e-ord-huge"]
    assert "unserialisable" in result.rejected[0][1]
    expected = fold_all(P, normal)
    assert result.states == expected.states
    assert result.aggregate == expected.aggregate
    with pytest.raises(UnstorableStateError) as caught:
        fold_one(P, None, *huge)
    assert caught.value.reason == "unserialisable"


def test_revenue_beyond_64_bits_is_overflow():
    order_total = 2 * 2**62  # 2**63: a storable state, but not a Redis counter
    placed = _placed("o1", 2, 2**62)
    paid = {
        "event_id": "e-paid",
        "order_id": "o1",
        "amount_minor": order_total,
        "currency": "EUR",
        "payment_method": "CARD",
        "paid_at": 2,
    }
    state, _encoded, _contribution, _effects = fold_one(P, None, *placed)
    assert state["total_minor"] == order_total
    with pytest.raises(UnstorableStateError) as caught:
        fold_one(P, state, "OrderPaid", paid)
    assert caught.value.reason == "overflow"
    result = fold_all(P, [placed, ("OrderPaid", paid)])
    assert [event_id for event_id, _reason in result.rejected] == ["e-paid"]
    assert result.states["o1"]["status"] == "placed"
