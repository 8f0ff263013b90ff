"""The fold envelope under bad records and lost writes: real Redis, real broker, no Spark.

Each test here failed before its fix (issue "never stuck, never lost"): a poison pill stopped
the processor, a wrong key was folded on the wrong partition, a range Redis lost was never
folded again, and a counter overflow in Redis broke the transaction half way.
"""

from __future__ import annotations

import dataclasses

from refold.contracts.codec import EventCodec
from refold.contracts.commerce import ORDERS
from refold.contracts.store.connect import redis_client
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import fold_all
from refold.processors.fold.records import SourceRecord
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.envelope import FoldWriter
from refold.services.producer.publisher import EventPublisher
from refold.services.reader.state_reader import StateReader
from tests.support.topics import source_records

P = OrderStateProjection()


def _state(target):
    reader = StateReader.from_url(target.redis_url, "order_state", target.key_prefix)
    return (
        dict(reader.scan("orders", generation=1)),
        reader.aggregate("order_totals", generation=1).value,
    )


def _poison(order_id="ord-poison"):
    return (
        "OrderPlaced",
        {
            "event_id": "evt-poison",
            "order_id": order_id,
            "customer_id": "cus-1",
            "currency": "EUR",
            "lines": [{"sku": "sku-1", "qty": 4, "unit_price_minor": 2**62}],
            "placed_at": 1,
        },
    )


def test_a_valid_event_whose_state_cannot_be_stored_is_dead_lettered_alone(target):
    events = list(OrderSimulator(200, seed=3, anomaly_rate=0))
    cut = len(events) // 2
    stream = [*events[:cut], _poison(), *events[cut:]]
    codec = EventCodec()
    records = [
        SourceRecord("orders", 0, i, str(e["order_id"]).encode(), codec.encode(t, e))
        for i, (t, e) in enumerate(stream)
    ]

    outcome = FoldWriter(target, P).apply(records)

    assert outcome.rejected == 1
    assert outcome.applied == len(events)
    assert outcome.positions == {"orders/0": len(stream)}
    expected = fold_all(P, stream)
    assert [reason for _id, reason in expected.rejected if "unserialisable" in reason]
    states, totals = _state(target)
    assert states == expected.states
    assert "ord-poison" not in states
    assert totals == dict(expected.aggregate)


def test_records_whose_kafka_key_is_not_the_entity_key_are_dead_letters(target):
    events = list(OrderSimulator(30, seed=4, anomaly_rate=0))
    codec = EventCodec()
    records = []
    wrong = set()
    for i, (t, e) in enumerate(events):
        key = str(e["order_id"]).encode()
        if i % 7 == 3:
            key = None if i % 2 else b"someone-else"
            wrong.add(i)
        records.append(SourceRecord("orders", 0, i, key, codec.encode(t, e)))

    outcome = FoldWriter(target, P).apply(records)

    good = [ev for i, ev in enumerate(events) if i not in wrong]
    expected = fold_all(P, good)  # later events of a refused order are refused in turn
    assert outcome.rejected == len(wrong) + len(expected.rejected)
    states, _totals = _state(target)
    assert states == expected.states


def test_a_range_redis_lost_is_read_and_folded_again(target, kafka_bootstrap, make_topic):
    topic = make_topic(partitions=4, prefix="orders")
    publisher = EventPublisher(
        target_kafka(kafka_bootstrap),
        topics=[dataclasses.replace(ORDERS, name=topic, partitions=4)],
    )
    events = list(OrderSimulator(600, seed=11, anomaly_rate=0))
    half = len(events) // 2
    publisher.emit_many(events[:half])
    first, ends_first = source_records(kafka_bootstrap, topic, 4)
    writer = FoldWriter(target, P)
    writer.apply(first)
    client = redis_client(target.redis_url)
    backup = {k: client.dump(k) for k in client.scan_iter(match=f"{target.key_prefix}:*")}

    publisher.emit_many(events[half : half + half // 2])
    second, ends_second = source_records(
        kafka_bootstrap, topic, 4, {p: ends_first[(topic, p)] for p in range(4)}
    )
    writer.apply(second)
    # Redis loses the second part: a restore from the backup taken in between.
    client.delete(*client.scan_iter(match=f"{target.key_prefix}:*"))
    for key, value in backup.items():
        client.restore(key, 0, value)

    publisher.emit_many(events[half + half // 2 :])
    third, _ = source_records(
        kafka_bootstrap, topic, 4, {p: ends_second[(topic, p)] for p in range(4)}
    )
    outcome = writer.apply(third)

    assert outcome.applied == len(events) - half
    states, totals = _state(target)
    expected = fold_all(P, events)
    assert states == expected.states
    assert totals == dict(expected.aggregate)
    publisher.close()


def target_kafka(bootstrap):
    from refold.contracts.settings import KafkaSettings

    return KafkaSettings(bootstrap_servers=bootstrap)


def test_a_covered_range_without_records_still_moves_the_position(target):
    writer = FoldWriter(target, P)
    outcome = writer.apply([], batch_id=3, covered={"orders/0": (0, 5)})
    assert outcome.positions == {"orders/0": 5}
    again = writer.apply([], batch_id=4, covered={"orders/0": (5, 5)})
    assert again.positions == {}


def test_an_aggregate_counter_that_would_overflow_refuses_only_the_record_that_overflows(target):
    codec = EventCodec()
    big = 2**61  # four paid orders of 2**61 sum to 2**63: one past the signed 64-bit range
    stream = []
    for n in range(4):
        order = f"ord-big-{n}"
        stream.append(
            (
                "OrderPlaced",
                {
                    "event_id": f"p{n}",
                    "order_id": order,
                    "customer_id": "c",
                    "currency": "EUR",
                    "lines": [{"sku": "s", "qty": 1, "unit_price_minor": big}],
                    "placed_at": 1,
                },
            )
        )
    paid = [
        (
            "OrderPaid",
            {
                "event_id": f"y{n}",
                "order_id": f"ord-big-{n}",
                "amount_minor": big,
                "currency": "EUR",
                "payment_method": "CARD",
                "paid_at": 2,
            },
        )
        for n in range(4)
    ]
    writer = FoldWriter(target, P)

    def recs(events, first):
        return [
            SourceRecord("orders", 0, first + i, e["order_id"].encode(), codec.encode(t, e))
            for i, (t, e) in enumerate(events)
        ]

    writer.apply(recs(stream, 0))
    outcome = writer.apply(recs(paid, 4))

    assert outcome.applied == 3
    assert outcome.rejected == 1
    states, totals = _state(target)
    assert totals["revenue_minor:EUR"] == 3 * big
    assert [states[f"ord-big-{n}"]["status"] for n in range(4)] == ["paid"] * 3 + ["placed"]
