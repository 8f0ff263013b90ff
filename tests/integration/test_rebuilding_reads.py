"""Reads of a generation catching up from an empty store say "rebuilding", not "not found".

The processor's own start (``resolve_run`` creating the live generation, then
``record_starting_positions``) on a real broker and redis-server; the fold writer stands in for
Spark's batches. A generation's normal lag afterwards is "not found" again.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from fastapi.testclient import TestClient

from refold.contracts.codec import EventCodec
from refold.contracts.commerce import ORDERS
from refold.contracts.settings import KafkaSettings, RedisSettings
from refold.contracts.store.connect import redis_client
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.records import SourceRecord
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from refold.processors.runtime.run_plan import RunOptions, record_starting_positions, resolve_run
from refold.services.api.app import create_app
from refold.services.api.config import HttpSettings, ServeSettings
from refold.services.api.context import ServiceContext
from refold.services.errors import StateRebuildingError
from refold.services.reader.state_reader import StateReader

pytestmark = pytest.mark.integration

PARTITIONS = 2


def _produce(bootstrap: str, topic: str, events, first: list[int]) -> list[SourceRecord]:
    """Write ``events`` by order id; ``first`` holds each partition's next offset (updated)."""
    codec = EventCodec()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    records = []
    for event_type, event in events:
        key = event["order_id"].encode()
        partition = zlib.crc32(key) % PARTITIONS
        value = codec.encode(event_type, event)
        producer.produce(topic, value, key, partition=partition)
        records.append(SourceRecord(topic, partition, first[partition], key, value))
        first[partition] += 1
    assert producer.flush(30) == 0
    return records


@pytest.fixture
def world(kafka_bootstrap, redis_url, make_topic, unique, tmp_path) -> Iterator[dict]:
    topic = make_topic(partitions=PARTITIONS, prefix="orders")
    prefix = f"test-{unique}"
    settings = ServeSettings(
        kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap),
        redis=RedisSettings(url=redis_url, key_prefix=prefix),
        serve=HttpSettings(auth="off"),
    )
    client = redis_client(redis_url)
    spec = dataclasses.replace(ORDERS, name=topic, partitions=PARTITIONS)
    context = ServiceContext(settings, client, topics=[spec], redis_url=redis_url)
    with TestClient(create_app(settings, context=context)) as http:
        yield {
            "http": http,
            "topic": topic,
            "spec": spec,
            "prefix": prefix,
            "client": client,
            "kafka": KafkaSettings(bootstrap_servers=kafka_bootstrap),
            "redis": RedisSettings(url=redis_url, key_prefix=prefix),
            "checkpoints": tmp_path / "checkpoints",
            "dlq": make_topic(1, prefix="dlq"),
        }
    context.close()


def test_reads_say_rebuilding_until_the_log_end_at_start_then_normal_lag_is_not_found(world):
    offsets = [0] * PARTITIONS
    events = list(OrderSimulator(60, seed=7, anomaly_rate=0))
    records = _produce(world["kafka"].bootstrap_servers, world["topic"], events, offsets)
    key = events[0][1]["order_id"]
    url = "/v1/processors/order_state/tables/orders/entities/"
    reader = StateReader(world["client"], "order_state", world["prefix"])

    # The processor starts over from the log on an empty store: a new live generation 1.
    run = resolve_run(
        OrderStateProjection(),
        [world["spec"]],
        world["kafka"],
        world["redis"],
        RunOptions(checkpoint_root=world["checkpoints"]),
        world["client"],
    )
    assert reader.live_generation() == run.generation
    # Before it has recorded where it starts: rebuilding, having applied nothing.
    with pytest.raises(StateRebuildingError) as raised:
        reader.get("orders", key)
    assert (raised.value.code, raised.value.generation, raised.value.behind) == (
        "REBUILDING",
        run.generation,
        {},
    )
    early = world["http"].get(url + key)
    assert early.status_code == 503, early.text
    assert early.json()["error"]["code"] == "REBUILDING"
    assert early.headers["Retry-After"] == "1"

    run = record_starting_positions(run, reader.registry, world["kafka"], [world["spec"]])
    ends = {(world["topic"], p): offsets[p] for p in range(PARTITIONS)}
    target = FoldTarget(
        "order_state",
        run.generation,
        world["redis"].client_url(),
        world["prefix"],
        (("bootstrap.servers", world["kafka"].bootstrap_servers),),
        world["dlq"],
    )
    writer = FoldWriter(target, OrderStateProjection())
    half = [r for r in records if r.offset < ends[(r.topic, r.partition)] // 2]
    writer.apply(half, batch_id=0)
    # Part way: found or not, an entity is not complete yet; both answer 503 with the freshness.
    for wanted in (key, "no-such-order"):
        answer = world["http"].get(url + wanted)
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["code"] == "REBUILDING"
        assert error["generation"] == run.generation
        assert error["behind"] == {f"{t}/{p}": o for (t, p), o in ends.items()}
        assert "is rebuilding from the log" in error["message"]
        assert answer.headers["Retry-After"] == "1"
    with pytest.raises(StateRebuildingError, match=r"is rebuilding from the log \("):
        reader.get_many("orders", [key, "no-such-order"])

    # Caught up with the log end it started behind: a missing entity does not exist.
    writer.apply([r for r in records if r not in half], batch_id=1)
    assert reader.get("orders", key).value is not None
    assert world["http"].get(url + key).status_code == 200
    missing = world["http"].get(url + "no-such-order")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "ENTITY_NOT_FOUND"

    # Normal lag later (new records not applied yet) is not a rebuild: still 404, not 503.
    _produce(
        world["kafka"].bootstrap_servers,
        world["topic"],
        list(OrderSimulator(10, seed=8, order_prefix="later-")),
        offsets,
    )
    assert world["http"].get(url + "no-such-order").status_code == 404
    assert reader.get("orders", "no-such-order").value is None


def test_a_processor_starting_at_the_log_end_is_not_rebuilding(world):
    offsets = [0] * PARTITIONS
    _produce(world["kafka"].bootstrap_servers, world["topic"], list(OrderSimulator(5)), offsets)
    run = resolve_run(
        OrderStateProjection(),
        [world["spec"]],
        world["kafka"],
        world["redis"],
        RunOptions(checkpoint_root=world["checkpoints"], starting_offsets="latest"),
        world["client"],
    )
    reader = StateReader(world["client"], "order_state", world["prefix"])
    record_starting_positions(run, reader.registry, world["kafka"], [world["spec"]])
    missing = world["http"].get("/v1/processors/order_state/tables/orders/entities/nope")
    assert missing.status_code == 404, missing.text
