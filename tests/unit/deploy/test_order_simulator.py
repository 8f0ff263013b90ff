from collections import Counter

from refold.contracts.codec import EventCodec
from refold.contracts.commerce import ORDERS
from refold.deploy.simulators.orders import OrderSimulator


def test_same_seed_same_stream():
    assert list(OrderSimulator(300, seed=5)) == list(OrderSimulator(300, seed=5))
    assert list(OrderSimulator(300, seed=5)) != list(OrderSimulator(300, seed=6))


def test_every_event_meets_its_contract_and_belongs_to_the_orders_topic():
    codec = EventCodec()
    events = list(OrderSimulator(500, seed=1))
    for event_type, event in events:
        assert event_type in ORDERS.event_types
        codec.validate(event_type, event)
    kinds = Counter(t for t, _ in events)
    assert kinds["OrderPlaced"] == 500
    assert kinds["OrderLineAdded"] > kinds["OrderPaid"] > kinds["OrderCancelled"]


def test_about_ten_events_per_order():
    events = list(OrderSimulator(1000, seed=2))
    assert 8_000 < len(events) < 12_000
