"""Outputs once after Redis comes back empty (issue 44 item 2), on Spark, Kafka and Redis.

order_alerts runs as a processor process with the webhook dispatcher beside it. Under traffic,
every key of the deployment is deleted from Redis (what a Redis restarted without its data
shows). The processor starts over in a new generation from the log and rebuilds its state; its
insights topic must still hold each insight once, its dead-letter topic each bad record once,
and the webhook receiver must get each Idempotency-Key once.

Before the fix the new generation sent every insight and letter again: its marker group and
dead-letter index were new, and the old ones lived only in the lost Redis.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections import Counter
from pathlib import Path

from confluent_kafka import Producer

from refold.contracts.codec import MAGIC, EventCodec
from refold.contracts.commerce import ORDERS
from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessLauncher
from refold.contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.deploy.simulators.orders import OrderSimulator
from refold.deploy.simulators.webhook_receiver import WebhookReceiver
from refold.processors.fold.patterns import PatternOptions
from refold.services.producer.publisher import EventPublisher
from refold.services.webhooks import WebhookDispatcher, WebhookSettings
from tests.support.dead_letters import dlq_letters
from tests.support.topics import read_to_end
from tests.support.waiting import assert_eventually

NAME = "order_alerts"
CODEC = EventCodec()


def _insight_ids(bootstrap: str, topic: str) -> Counter[str]:
    """How often each insight is on ``topic``."""
    seen: Counter[str] = Counter()
    for message in read_to_end(bootstrap, topic):
        value = message.value()
        assert value.startswith(MAGIC)
        seen[CODEC.decode(value).data["insight_id"]] += 1
    return seen


def _bad_records(bootstrap: str, topic: str, count: int, seed: int) -> None:
    """``count`` records that are not Avro, keyed like orders (each a dead letter)."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for n in range(count):
        key = f"ord-bad-{seed}-{n}".encode()
        partition = zlib.crc32(key) % ORDERS.partitions
        producer.produce(topic, b"not avro", key, partition=partition)
    assert producer.flush(30) == 0


def test_outputs_go_out_once_across_a_redis_that_comes_back_empty(
    kafka_bootstrap, redis_url, make_topic, unique, tmp_path: Path
):
    orders = make_topic(partitions=ORDERS.partitions, prefix="orders")
    insights = make_topic(partitions=4, prefix="insights")
    dlq = make_topic(partitions=1, prefix="dlq")
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    prefix = f"test-{unique}"
    redis_settings = RedisSettings(url=redis_url, key_prefix=prefix)
    options = PatternOptions(
        topics=[orders], dead_letter_topic=dlq, insights_topic=insights, max_offsets_per_trigger=800
    )
    launcher = ProcessLauncher(kafka, redis_settings, SparkSettings(), tmp_path, {NAME: options})
    publisher = EventPublisher(kafka, topics=[dataclasses.replace(ORDERS, name=orders)])
    events = list(OrderSimulator(600, seed=44, concurrency=400))
    half = len(events) // 2
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, NAME, prefix)

    def applied() -> int:
        live = registry.live()
        return 0 if live is None else sum(registry.positions(live)[0].values())

    receiver = WebhookReceiver().__enter__()
    settings = WebhookSettings(
        name=f"wh-{unique}", url=receiver.url, topics=(insights,), severities=(), batch_size=50
    )
    dispatcher = WebhookDispatcher(
        settings, {"bootstrap.servers": kafka_bootstrap}, client, prefix
    ).start()
    process = GroupProcess(launcher.argv([NAME]), launcher.env(), tmp_path / "run.log").start()
    try:
        publisher.emit_many(events[:half])
        _bad_records(kafka_bootstrap, orders, 20, seed=1)
        first = half + 20
        assert_eventually(
            lambda: applied() >= first and len(receiver.accepted) > 0,
            timeout=240,
            alive=process.alive,
            message=process.log_tail,
        )
        before = _insight_ids(kafka_bootstrap, insights)
        assert before, "the premise: insights went out before Redis was lost"
        assert len(dlq_letters(kafka_bootstrap, dlq)) == 20

        # Redis comes back empty: every key of the deployment is gone. The processor notices
        # between batches and starts over in a new generation (another created_at: another
        # marker group); the traffic goes on meanwhile.
        created = registry.meta(1)["created_at"]
        lost = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        assert lost
        client.unlink(*lost)
        publisher.emit_many(events[half : half + 100])
        assert_eventually(
            lambda: (
                registry.live() is not None
                and registry.meta(registry.live() or 0).get("created_at") not in (None, created)
            ),
            timeout=120,
            alive=process.alive,
            message=process.log_tail,
        )
        publisher.emit_many(events[half + 100 :])
        _bad_records(kafka_bootstrap, orders, 20, seed=2)
        total = len(events) + 40

        # The processor starts over in a new generation and folds the whole log again.
        assert_eventually(
            lambda: applied() >= total,
            timeout=300,
            alive=process.alive,
            message=process.log_tail,
        )
        # Outputs are committed before the positions that caused them: all are there now.
        on_topic = _insight_ids(kafka_bootstrap, insights)
        twice = {i: n for i, n in on_topic.items() if n > 1}
        assert not twice, f"{len(twice)} of {len(on_topic)} insights went out more than once"
        assert set(before) <= set(on_topic)
        letters = Counter((p, o, r) for p, o, r, _g in dlq_letters(kafka_bootstrap, dlq))
        assert len(letters) == 40
        assert max(letters.values()) == 1, "a bad record was dead-lettered twice"
        # The dispatcher carried on through the empty Redis and delivered each insight once.
        assert_eventually(
            lambda: len(receiver.accepted) == len(on_topic) and dispatcher.alive,
            timeout=60,
        )
        assert receiver.duplicates == 0
        assert receiver.snapshot()["requests"] == len(on_topic)
    finally:
        process.stop()
        dispatcher.stop()
        receiver.__exit__(None, None, None)
        publisher.close()
