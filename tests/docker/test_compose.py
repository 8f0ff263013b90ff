"""The integration scenario against deploy/compose.yaml (Apache Kafka + Redis).

Skipped where no Docker engine answers (the development machines have only the client).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
import redis

COMPOSE = Path(__file__).resolve().parents[2] / "deploy" / "compose.yaml"


def _engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return info.returncode == 0


pytestmark = pytest.mark.skipif(
    not _engine_answers(), reason="no Docker engine answers (`docker info` fails)"
)


@pytest.fixture(scope="module")
def compose_stack():
    base = ["docker", "compose", "-f", str(COMPOSE)]
    subprocess.run([*base, "up", "-d", "--wait", "kafka", "redis"], check=True, timeout=600)
    try:
        yield "localhost:9092", "redis://localhost:6379/0"
    finally:
        subprocess.run([*base, "down", "-v"], check=False, timeout=300)


def test_publish_fold_and_read_on_apache_kafka(compose_stack, unique):
    from contracts.offsets import LogOffsets
    from contracts.settings import KafkaSettings
    from contracts.topic_admin import delete_topics, ensure_topics
    from contracts.topics import ORDERS, TopicSpec
    from processors.common.fold_writer import FoldTarget, FoldWriter, SourceRecord
    from processors.common.projection import fold_all
    from processors.order_state.projection import OrderStateProjection
    from services.producer.publisher import EventPublisher
    from services.producer.simulator import OrderSimulator
    from services.reader.state_reader import StateReader

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
        from contracts.codec import EventCodec

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
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not reader.freshness(1):
            time.sleep(0.1)
        assert dict(reader.scan("orders", 1)) == fold_all(OrderStateProjection(), events).states
    finally:
        delete_topics(kafka.as_librdkafka(), [topic.name])
