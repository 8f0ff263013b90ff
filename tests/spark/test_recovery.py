"""Restarts and bad input through the real processor: defects 3 and 5, 10k bad records."""

from __future__ import annotations

import os
import random
import socket

from confluent_kafka import Producer

from refold.contracts.codec import EventCodec
from refold.contracts.layout import position_field
from refold.contracts.store.generations import GenerationRegistry
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.runtime.group_mirror import ConsumerGroupMirror
from refold.processors.runtime.runner import consumer_group
from tests.support.groups import committed_offsets
from tests.support.waiting import assert_eventually

from .conftest import oracle


def _group(world, generation):
    return committed_offsets(
        world.kafka, consumer_group("order_state", generation, world.redis.key_prefix)
    )


def test_after_a_restart_the_consumer_group_equals_the_applied_positions(spark, world):
    events = list(OrderSimulator(400, seed=12))
    world.publisher().emit_many(events)
    generation = world.run_available_now(spark)
    positions = world.reader().freshness(generation)
    # The crash between the Redis commit and the group commit: the group stays behind.
    mirror = ConsumerGroupMirror(
        world.kafka.as_librdkafka(),
        consumer_group("order_state", generation, world.redis.key_prefix),
    )
    mirror.commit({position_field(t, p): max(0, o - 7) for (t, p), o in positions.items()})
    mirror.close()
    assert _group(world, generation) != positions

    world.run_available_now(spark)

    assert _group(world, generation) == positions


def test_a_restart_while_another_processor_lets_go_of_the_lease_waits_for_it(spark, world):
    events = list(OrderSimulator(300, seed=13))
    world.publisher().emit_many(events[:1000])
    generation = world.run_available_now(spark)
    registry = GenerationRegistry.of(world.client, "order_state", world.redis.key_prefix)
    # Like replay's processor finishing its last batch right after a cutover: alive, still
    # holding the lease for a few seconds.
    holder = f"{socket.gethostname()}:{os.getpid()}:cutover"
    # Held until the new processor has met it (it says it waits), then let go: no fixed
    # delay to outlast its start-up. The TTL only bounds a test that fails half way.
    assert registry.claim_lease(generation, holder, 180_000)
    log = world.state_dir / "logs" / "after-cutover.log"
    process = world.processor(name="after-cutover").start()
    try:
        assert_eventually(
            lambda: log.exists() and "waiting for g" in log.read_text(),
            timeout=120,
            alive=process.alive,
            message=process.log_tail,
        )
        assert registry.lease_owner(generation) == holder  # it met the lease held
        registry.release_lease(generation, holder)
        assert process.alive(), process.log_tail()
        world.publisher().emit_many(events[1000:])
        expected = oracle(events)
        assert_eventually(
            lambda: world.state(generation)[0] == expected.states,
            timeout=180,
            alive=process.alive,
            message=process.log_tail,
        )
        assert "waiting for g" in log.read_text()
    finally:
        registry.release_lease(generation, holder)  # idempotent: only while ``holder`` has it
        process.stop()


def _malformed(codec: EventCodec, valid: list[tuple[str, dict]], count: int, seed: int):
    """(key, value) pairs no processor may fold: each kind the issue names."""
    rng = random.Random(seed)
    encoded = [codec.encode(t, e) for t, e in valid[:500]]
    out = []
    for n in range(count):
        kind = n % 7
        if kind == 0:  # garbage
            value = rng.randbytes(rng.randint(1, 200))
        elif kind == 1:  # truncated Avro
            whole = rng.choice(encoded)
            value = whole[: rng.randint(10, len(whole) - 1)]
        elif kind == 2:  # unknown fingerprint
            whole = rng.choice(encoded)
            value = whole[:2] + rng.randbytes(8) + whole[10:]
        elif kind == 3:  # huge values: valid Avro whose state cannot be stored
            order = f"ord-huge-{n}"
            value = codec.encode(
                "OrderPlaced",
                {
                    "event_id": f"huge-{n}",
                    "order_id": order,
                    "customer_id": "c",
                    "currency": "EUR",
                    "lines": [{"sku": "s", "qty": 4, "unit_price_minor": 2**62}],
                    "placed_at": 1,
                },
            )
            out.append((order.encode(), value))
            continue
        elif kind == 4:  # empty value
            value = b""
        elif kind == 5:  # null value (a tombstone)
            value = None
        else:  # a valid event with a null key
            value = rng.choice(encoded)
            out.append((None, value))
            continue
        out.append((rng.choice([None, b"ord-x", rng.randbytes(4)]), value))
    return out


def test_ten_thousand_malformed_records_are_all_dead_lettered_and_the_valid_ones_applied(
    spark, world
):
    codec = EventCodec()
    valid = list(OrderSimulator(400, seed=14, anomaly_rate=0))
    bad = _malformed(codec, valid, 10_000, seed=14)
    publisher = world.publisher()
    raw = Producer({**world.kafka.as_librdkafka(), "linger.ms": 5})
    third = len(valid) // 3
    publisher.emit_many(valid[:third])
    for n, (key, value) in enumerate(bad):
        raw.produce(world.topic.name, value, key, partition=n % world.topic.partitions)
        if n % 1000 == 0:
            raw.poll(0)
    raw.flush(30)
    publisher.emit_many(valid[third:])

    world.run_available_now(spark)

    states, totals = world.state()
    expected = oracle(valid)
    assert states == expected.states
    assert totals == dict(expected.aggregate)
    offsets = world.offsets()
    dead = offsets.end_offsets([(world.dlq, 0)])[(world.dlq, 0)]
    offsets.close()
    assert dead >= len(bad)  # at least once; exactly once unless a batch was retried
