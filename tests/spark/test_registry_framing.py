"""A topic that a producer knowing nothing of refold writes is folded by order_state (issue 47).

The topic moves over as a team would move an existing one (issue 47 item 5): refold's producer
SDK writes the first part of the orders in single-object encoding, then a plain confluent-kafka
producer with confluent-kafka's own ``AvroSerializer`` (registry framing, RecordNameStrategy
subjects, the latest registered version) writes the rest, and one record carries a schema id the
registry does not know. order_state folds the topic in Spark with the registry of the session
(Apicurio, as ``refold up --schema-registry`` starts it, the contracts registered by ``refold
contracts publish``): its state equals the plain-Python oracle over every event, and the
unknown id is a dead letter with its reason.
"""

from __future__ import annotations

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient, record_subject_name_strategy
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from refold.contracts.catalog import default_catalog
from refold.deploy import contracts_cli
from refold.deploy.simulators.orders import OrderSimulator
from tests.support.dead_letters import dlq_letters

from .conftest import oracle


def foreign_producer(bootstrap: str, registry_url: str, topic: str, events) -> None:
    """Write ``events`` as a plain confluent-kafka application would: AvroSerializer, no refold."""
    client = SchemaRegistryClient({"url": registry_url})
    conf = {
        "auto.register.schemas": False,
        "use.latest.version": True,
        "subject.name.strategy": record_subject_name_strategy,
    }
    catalog = default_catalog()  # the .avsc files, as a team's repository holds them
    serializers = {
        name: AvroSerializer(client, catalog.latest(name).path.read_text(), conf=conf)
        for name in {event_type for event_type, _ in events}
    }
    # murmur2_random: the Java client's partitioner, so an order stays on one partition
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    context = SerializationContext(topic, MessageField.VALUE)
    for event_type, event in events:
        value = serializers[event_type](event, context)
        producer.produce(topic, value, event["order_id"].encode())
    producer.produce(topic, b"\x00\x00\x01\x86\x9f" + b"\x02", b"o-unknown-id")  # id 99999
    assert producer.flush(30) == 0


def test_order_state_folds_a_topic_a_foreign_avro_serializer_writes(
    spark, world, schema_registry, monkeypatch
):
    monkeypatch.setenv("REFOLD_SCHEMA_REGISTRY__URL", schema_registry.url)
    assert contracts_cli.main(["publish"]) == 0
    events = list(OrderSimulator(400, seed=47))
    half = len(events) // 2
    world.publisher().emit_many(events[:half])  # single-object: before the move
    foreign_producer(
        world.kafka.bootstrap_servers, schema_registry.url, world.topic.name, events[half:]
    )

    generation = world.run_available_now(spark)

    expected = oracle(events)
    states, totals = world.state(generation)
    assert states == expected.states
    assert totals == dict(expected.aggregate)
    reasons = [reason for _, _, reason, _ in dlq_letters(world.kafka.bootstrap_servers, world.dlq)]
    assert reasons.count("unknown-schema-id") == 1
    assert len(reasons) == 1 + len(expected.rejected)
