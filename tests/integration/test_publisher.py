import pytest
from confluent_kafka import Consumer, TopicPartition

from contracts.errors import EventValidationError
from contracts.settings import KafkaSettings
from contracts.topics import ORDERS, TopicSpec
from services.producer.publisher import EventPublisher
from services.producer.simulator import OrderSimulator


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
    # murmur2 of the key, as Kafka's Java DefaultPartitioner: toPositive(murmur2(key)) % n.
    def murmur2(data: bytes) -> int:
        m, r = 0x5BD1E995, 24
        length = len(data)
        h = (0x9747B28C ^ length) & 0xFFFFFFFF
        for i in range(0, length - length % 4, 4):
            k = int.from_bytes(data[i : i + 4], "little")
            k = (k * m) & 0xFFFFFFFF
            k ^= k >> r
            k = (k * m) & 0xFFFFFFFF
            h = (h * m) & 0xFFFFFFFF
            h ^= k
        rest = length % 4
        tail = data[length - rest :]
        if rest == 3:
            h ^= tail[2] << 16
        if rest >= 2:
            h ^= tail[1] << 8
        if rest >= 1:
            h ^= tail[0]
            h = (h * m) & 0xFFFFFFFF
        h ^= h >> 13
        h = (h * m) & 0xFFFFFFFF
        h ^= h >> 15
        return h

    publisher = EventPublisher(
        KafkaSettings(bootstrap_servers=kafka_bootstrap), topics=[orders_topic]
    )
    events = list(OrderSimulator(20, seed=4))[:20]
    for token, (_, event) in zip(publisher.emit_many(events), events, strict=True):
        assert token.partition == (murmur2(event["order_id"].encode()) & 0x7FFFFFFF) % 4


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
