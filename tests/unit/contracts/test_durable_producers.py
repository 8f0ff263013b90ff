"""Every producer refold runs is acknowledged by all in-sync replicas and idempotent, says so
once at its start, and a topic with one replica on a cluster of several is named."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from refold.contracts.kafka import delivery
from refold.contracts.kafka.admin import single_replica_topics
from refold.contracts.kafka.delivery import announce, delivery_summary, durable
from refold.contracts.kafka.outputs import output_producer
from refold.contracts.settings import KafkaSettings
from refold.contracts.topics import TopicSpec
from refold.services.producer.publisher import EventPublisher


def _topic(replicas: int) -> SimpleNamespace:
    partition = SimpleNamespace(replicas=list(range(1, replicas + 1)))
    return SimpleNamespace(partitions={0: partition, 1: partition})


def test_a_client_property_that_weakens_acks_is_overridden_and_named(caplog):
    with caplog.at_level(logging.WARNING, logger=delivery.__name__):
        config = durable({"acks": "1", "enable.idempotence": "false", "linger.ms": 5}, "the SDK")
    assert config == {"acks": "all", "enable.idempotence": "true", "linger.ms": 5}
    assert [r.getMessage() for r in caplog.records] == [
        "the SDK: acks=1 in the client properties is overridden with acks=all (refold's "
        "producers are acknowledged by every in-sync replica, and idempotent)",
        "the SDK: enable.idempotence=false in the client properties is overridden with "
        "enable.idempotence=true (refold's producers are acknowledged by every in-sync "
        "replica, and idempotent)",
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=delivery.__name__):
        durable({"acks": "-1", "enable.idempotence": True}, "the SDK")  # the same, other words
    assert caplog.records == []


def test_each_producer_says_once_what_it_uses(caplog, monkeypatch):
    monkeypatch.setattr(delivery, "_announced", set())
    config = {"bootstrap.servers": "a:1,b:2", **delivery.DURABLE, "message.timeout.ms": "120000"}
    assert delivery_summary(config) == "acks=all, idempotent, delivery timeout 120 s"
    with caplog.at_level(logging.INFO, logger=delivery.__name__):
        announce("HTTP ingest", config)
        announce("HTTP ingest", config)
        output_producer({"bootstrap.servers": "a:1", "transactional.id": "w-1"})
        EventPublisher(KafkaSettings(bootstrap_servers="a:1")).producer  # noqa: B018
    assert [r.getMessage() for r in caplog.records] == [
        "HTTP ingest produces to a:1,b:2 with acks=all, idempotent, delivery timeout 120 s",
        "a processor's transactional outputs produces to a:1 with acks=all, idempotent, "
        "transactional, delivery timeout 300 s",
        "the producer SDK produces to a:1 with acks=all, idempotent, delivery timeout 120 s",
    ]


def test_a_topic_with_one_replica_on_a_cluster_is_named():
    specs = [
        TopicSpec("orders", 2, "order_id", ("OrderPlaced",)),
        TopicSpec("old", 2, "order_id", ("OrderPlaced",)),
        TopicSpec("pinned", 2, "order_id", ("OrderPlaced",), replication_factor=1),
        TopicSpec("new", 2, "order_id", ("OrderPlaced",)),
    ]
    existing = {"orders": _topic(3), "old": _topic(1)}
    assert single_replica_topics(specs, existing, brokers=3) == ["old", "pinned"]
    assert single_replica_topics(specs, existing, brokers=1) == []
