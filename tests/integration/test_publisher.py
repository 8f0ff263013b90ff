import time

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from refold.contracts.codec import EventCodec
from refold.contracts.commerce import ORDERS
from refold.contracts.errors import EventValidationError
from refold.contracts.kafka.partitioner import key_partition
from refold.contracts.settings import KafkaSettings
from refold.contracts.topics import TopicSpec
from refold.deploy.local_stack import free_port
from refold.deploy.simulators.orders import OrderSimulator
from refold.services.errors import PublishError
from refold.services.producer.publisher import EventPublisher
from tests.support.waiting import assert_eventually


@pytest.fixture
def orders_topic(make_topic):
    name = make_topic(partitions=4, prefix="orders")
    return TopicSpec(name, 4, "order_id", ORDERS.event_types)


def read_all(bootstrap, topic, partitions):
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "test-reader", "enable.auto.commit": "false"}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records = []
    idle = 0
    while idle < 5:
        batch = consumer.consume(1000, timeout=0.5)
        idle = 0 if batch else idle + 1
        records.extend(m for m in batch if m.error() is None)
    consumer.close()
    return records


def test_emit_returns_where_the_event_landed(kafka_bootstrap, orders_topic):
    publisher = EventPublisher(
        KafkaSettings(bootstrap_servers=kafka_bootstrap), topics=[orders_topic]
    )
    events = list(OrderSimulator(50, seed=11))
    tokens = publisher.emit_many(events)
    assert len(tokens) == len(events)
    by_order: dict[str, set[int]] = {}
    for (_, event), token in zip(events, tokens, strict=True):
        assert token.topic == orders_topic.name
        by_order.setdefault(event["order_id"], set()).add(token.partition)
    assert all(len(parts) == 1 for parts in by_order.values())  # one aggregate, one partition
    assert len({p for parts in by_order.values() for p in parts}) > 1
    single = publisher.emit(*events[0])
    records = read_all(kafka_bootstrap, orders_topic.name, 4)
    assert len(records) == len(events) + 1
    landed = {(r.partition(), r.offset()) for r in records}
    assert {(t.partition, t.offset) for t in [*tokens, single]} == landed
    first = next(
        r for r in records if (r.partition(), r.offset()) == (single.partition, single.offset)
    )
    assert first.key() == events[0][1]["order_id"].encode()
    publisher.close()


def test_partitioning_matches_the_java_client(kafka_bootstrap, orders_topic):
    # refold's partitioner (a reader's shard of a key) against where the broker put each key.
    publisher = EventPublisher(
        KafkaSettings(bootstrap_servers=kafka_bootstrap), topics=[orders_topic]
    )
    events = list(OrderSimulator(20, seed=4))[:20]
    for token, (_, event) in zip(publisher.emit_many(events), events, strict=True):
        assert token.partition == key_partition(event["order_id"], 4)


def test_invalid_event_is_refused_and_nothing_is_sent(kafka_bootstrap, orders_topic):
    publisher = EventPublisher(
        KafkaSettings(bootstrap_servers=kafka_bootstrap), topics=[orders_topic]
    )
    event_type, event = next(iter(OrderSimulator(1, seed=1)))
    with pytest.raises(EventValidationError, match="customer_id"):
        publisher.emit(event_type, {**event, "customer_id": 7})
    with pytest.raises(EventValidationError, match="discount"):
        publisher.emit(event_type, {**event, "discount": 5})
    assert read_all(kafka_bootstrap, orders_topic.name, 4) == []


# ---------------------------------------------------------------- broker unreachable


def test_unreachable_broker_raises_naming_the_events_and_leaves_nothing_queued(
    private_stack, unique
):
    bootstrap = private_stack.bootstrap_servers
    topic = TopicSpec(f"orders-{unique}", 4, "order_id", ORDERS.event_types)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic.name, num_partitions=4)])[topic.name].result(timeout=30)
    publisher = EventPublisher(KafkaSettings(bootstrap_servers=bootstrap), topics=[topic])
    events = list(OrderSimulator(30, seed=5))
    accepted, frozen, after = events[:20], events[20:40], events[40]
    assert len(publisher.emit_many(accepted)) == 20

    producer = publisher.producer
    private_stack.pause("kafka")  # the broker holds its connections but never answers
    try:
        started = time.monotonic()
        with pytest.raises(PublishError) as caught:
            publisher.emit_many(frozen, timeout=5)
        elapsed = time.monotonic() - started
        queued_after_purge = len(producer)
    finally:
        private_stack.pause("kafka", paused=False)

    error = caught.value
    assert 5 <= elapsed < 5 + 5, elapsed  # after its timeout, not librdkafka's 300 s
    assert queued_after_purge == 0  # nothing left to be delivered behind the caller's back
    assert (error.code, error.retriable) == ("PUBLISH_FAILED", True)
    assert [u.index for u in error.unacknowledged] == list(range(20))
    for u, (event_type, event) in zip(error.unacknowledged, frozen, strict=True):
        assert (u.event_type, u.topic, u.key) == (event_type, topic.name, event["order_id"])
        assert u.event_id == event["event_id"]
        assert u.event is event
        assert u.error in {"Local: Purged in flight", "Local: Purged in queue"}
    text = str(error)
    first = error.unacknowledged[0]
    assert text.startswith("[PUBLISH_FAILED] 20 of 20 events not acknowledged within 5s: #0 ")
    assert f"#0 {first.event_type} to {topic.name} key {first.key!r}" in text
    assert f"event_id {first.event_id!r}" in text
    assert "and 15 more" in text
    assert "may or may not have been written" in text

    # The SDK recovers once the broker answers again.
    token = publisher.emit(*after, timeout=30)
    assert token.topic == topic.name
    publisher.close()

    # Each purged event is on the log at most once (if its request had reached the broker),
    # never duplicated; everything acknowledged is there.
    codec = EventCodec()
    landed = [codec.decode(r.value()).data["event_id"] for r in read_all(bootstrap, topic.name, 4)]
    assert len(landed) == len(set(landed))
    assert {e["event_id"] for _, e in [*accepted, after]} <= set(landed)
    assert set(landed) <= {e["event_id"] for _, e in [*accepted, *frozen, after]}


def test_no_broker_listening_raises_with_the_client_error():
    publisher = EventPublisher(KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}"))
    event_type, event = next(iter(OrderSimulator(1, seed=2)))
    producer = publisher.producer
    started = time.monotonic()
    with pytest.raises(PublishError) as caught:
        publisher.emit(event_type, event, timeout=2)
    assert time.monotonic() - started < 2 + 5
    # Nothing left to deliver. len() also counts the client's error events, and a broker
    # that refuses connections raises a new one at each reconnect: serve them first (a
    # message left in the queue would stay for its 120 s message timeout).
    assert_eventually(lambda: producer.poll(0) >= 0 and len(producer) == 0, timeout=5)
    assert [u.event_id for u in caught.value.unacknowledged] == [event["event_id"]]
    assert "Connection refused" in str(caught.value)
