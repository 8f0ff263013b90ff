"""The integration scenario against deploy/compose.yaml (Apache Kafka + Redis), via pytest-docker.

The stack comes from ``compose_stack`` (tests/docker/conftest.py). Skipped, with the reason, where
no Docker engine answers (the development machines have only the client).
"""

from __future__ import annotations

import redis

from refold.contracts.codec import EventCodec
from refold.contracts.commerce import ORDERS
from refold.contracts.kafka.admin import delete_topics, ensure_topics
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.settings import KafkaSettings
from refold.contracts.topics import TopicSpec
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import fold_all
from refold.processors.fold.records import SourceRecord
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from refold.services.producer.publisher import EventPublisher
from refold.services.reader.state_reader import StateReader
from tests.support.waiting import assert_eventually


def test_publish_fold_and_read_on_apache_kafka(compose_stack, unique):
    bootstrap, redis_url = compose_stack
    kafka = KafkaSettings(bootstrap_servers=bootstrap)
    topic = TopicSpec(f"orders-{unique}", 4, "order_id", ORDERS.event_types)
    ensure_topics(kafka.as_librdkafka(), [topic])
    try:
        events = list(OrderSimulator(200, seed=1, anomaly_rate=0))
        tokens = EventPublisher(kafka, topics=[topic]).emit_many(events)
        offsets = LogOffsets(kafka.as_librdkafka())
        ends = offsets.end_offsets([(topic.name, p) for p in range(4)])
        offsets.close()
        assert sum(ends.values()) == len(tokens)
        target = FoldTarget(
            "order_state",
            1,
            redis_url,
            f"docker-{unique}",
            (("bootstrap.servers", bootstrap),),
            f"dlq-{unique}",
        )
        codec = EventCodec()
        records = sorted(
            (
                SourceRecord(
                    t.topic, t.partition, t.offset, e["order_id"].encode(), codec.encode(et, e)
                )
                for (et, e), t in zip(events, tokens, strict=True)
            ),
            key=lambda r: (r.partition, r.offset),
        )
        FoldWriter(target, OrderStateProjection()).apply(records)
        reader = StateReader(redis.Redis.from_url(redis_url), "order_state", f"docker-{unique}")
        assert_eventually(lambda: reader.freshness(1), timeout=5, message="no freshness in Redis")
        assert dict(reader.scan("orders", 1)) == fold_all(OrderStateProjection(), events).states
    finally:
        delete_topics(kafka.as_librdkafka(), [topic.name])
