"""Produce -> Spark processor -> Redis, compared key by key with the plain-Python oracle."""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from refold.contracts.layout import StateLayout
from refold.contracts.registry import processor_spec
from refold.contracts.store.stats import ProcessorStats
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.runtime.runner import consumer_group
from refold.processors.runtime.spark_scratch import scratch_root
from refold.replay.plan import ToEarliest
from refold.replay.rebuild import plan_replay, run_rebuild
from tests.support.groups import committed_offsets
from tests.support.waiting import assert_eventually

from .conftest import oracle


def test_fifty_thousand_events_fold_to_the_oracle_state(spark, world, caplog):
    events = list(OrderSimulator(5200, seed=41))
    assert len(events) >= 50_000
    world.publisher().emit_many(events)

    caplog.set_level(logging.DEBUG, logger="refold.processors.runtime.sink")
    generation = world.run_available_now(spark)
    # Batch 0 ran over the source's DataFrame; the driver planned the tasks of the later
    # batches (20k records each) from the checkpoint's offsets log.
    planned = [r.batch_id for r in caplog.records if "planned from the offsets log" in r.message]
    assert planned[:2] == [1, 2]

    expected = oracle(events)
    states, totals = world.state(generation)
    assert len(states) == len(expected.states)
    assert states == expected.states
    assert totals == dict(expected.aggregate)
    positions = world.reader().freshness()
    offsets = world.offsets()
    ends = offsets.end_offsets(list(positions))
    offsets.close()
    assert positions == ends
    assert len(positions) == world.topic.partitions
    # Progress is mirrored to a consumer group for standard lag tools (assign + commit).
    committed = committed_offsets(
        world.kafka, consumer_group("order_state", generation, world.redis.key_prefix)
    )
    assert committed == ends


def test_undecodable_records_go_to_the_dead_letter_topic_and_the_stream_goes_on(spark, world):
    good = list(OrderSimulator(300, seed=9, anomaly_rate=0))
    publisher = world.publisher()
    publisher.emit_many(good[:1000])
    raw = Producer({"bootstrap.servers": world.kafka.bootstrap_servers})
    raw.produce(world.topic.name, b"this is not avro", b"ord-0000001", partition=0)
    raw.produce(world.topic.name, b"\xc3\x01" + bytes(range(8)) + b"\x02ab", b"k", partition=1)
    raw.flush(10)
    publisher.emit_many(good[1000:])

    generation = world.run_available_now(spark)

    states, totals = world.state()
    assert states == oracle(good).states
    assert totals == dict(oracle(good).aggregate)
    # The driver counted every batch in the generation's stats, dead letters by reason.
    stats = ProcessorStats(world.client, StateLayout("order_state", world.redis.key_prefix))
    counted = stats.read(generation)
    assert counted.events == len(good)
    assert counted.dead_letters == {"bad-magic": 1, "unknown-fingerprint": 1}
    assert counted.batches >= 1
    assert counted.last_batch_id is not None
    assert counted.checkpoint_id  # read from the query's checkpoint
    consumer = Consumer(
        {
            "bootstrap.servers": world.kafka.bootstrap_servers,
            "group.id": "dlq-check",
            "enable.auto.commit": "false",
        }
    )
    consumer.assign([TopicPartition(world.dlq, 0, 0)])
    letters = []
    deadline = time.monotonic() + 20
    while len(letters) < 2 and time.monotonic() < deadline:
        letters += [m for m in consumer.consume(10, timeout=0.5) if m.error() is None]
    consumer.close()
    reasons = sorted(dict(m.headers())["refold.reason"] for m in letters)
    assert reasons == [b"bad-magic", b"unknown-fingerprint"]
    assert {m.value() for m in letters} == {
        b"this is not avro",
        b"\xc3\x01" + bytes(range(8)) + b"\x02ab",
    }


def test_processor_survives_kill_9_three_times_and_ends_exactly_at_the_oracle(world):
    events = list(OrderSimulator(5000, seed=77))
    world.publisher().emit_many(events)
    total = len(events)
    reader = world.reader()

    kills, scratch = [], []
    for fraction in (0.15, 0.45, 0.75):
        process = world.processor(name=f"crash-{fraction}").start()
        # Its driver's temporary files (the jars' copies among them) are in its own directory.
        # So are the JVM's own (java.io.tmpdir: Spark's artifacts-<uuid>), not in /tmp.
        scratch.append(scratch_root() / str(process.pid))
        assert_eventually(
            lambda: any(scratch[-1].glob("artifacts-*")), timeout=120, alive=process.alive
        )
        # SIGKILL, mid-stream: between or inside micro-batches
        kills.append(world.kill_after(process, int(fraction * total)))
    assert kills == sorted(kills)
    assert kills[-1] < total  # the last kill really happened before the end

    world.run_to_log_end("final")
    # Spark's shutdown hook never ran in the killed drivers: the next driver's start removed
    # what they left.
    assert [d for d in scratch if d.exists()] == []
    expected = oracle(events)
    states, totals = world.state()
    assert states == expected.states
    assert totals == dict(expected.aggregate)
    # The counts are written in the transactions that apply the records: exact after the kills.
    counted = ProcessorStats(world.client, StateLayout("order_state", world.redis.key_prefix))
    stats = counted.read(reader.registry.live())
    assert stats.events == total - len(expected.rejected) - expected.passed
    assert stats.dead_letters_total == len(expected.rejected)


def test_replay_rebuilds_a_new_generation_while_readers_stay_on_the_old_one(
    spark, world, monkeypatch
):
    events = list(OrderSimulator(1500, seed=5))
    world.publisher().emit_many(events)
    live = world.run_available_now(spark)
    expected = oracle(events)
    reader = world.reader()

    seen: list[tuple[int, bool]] = []
    stop = threading.Event()

    def read_loop() -> None:
        while not stop.is_set():
            view = reader.get("orders", "ord-0000007")
            seen.append((view.generation, view.value == expected.states["ord-0000007"]))
            time.sleep(0.01)

    thread = threading.Thread(target=read_loop)
    thread.start()
    try:
        spec = processor_spec("order_state")
        plan = plan_replay(spec, ToEarliest(), world.kafka, world.client, world.redis.key_prefix)
        assert plan.total_events == len(events)
        assert all(row.target == 0 for row in plan.partitions)
        for key, value in world.env.items():  # the deployment's environment
            monkeypatch.setenv(key, value)
        result = run_rebuild(plan, spec, world.kafka, world.redis, state_dir=world.state_dir)
    finally:
        stop.set()
        thread.join()

    assert result.previous == live
    assert result.generation == live + 1
    assert reader.live_generation() == result.generation
    new_states, new_totals = world.state(result.generation)
    assert new_states == expected.states
    assert new_totals == dict(expected.aggregate)
    # Readers saw the old generation, then the new one, never a mix and never a missing order.
    generations = [g for g, _ in seen]
    assert generations == sorted(generations)
    assert set(generations) <= {live, result.generation}
    assert all(ok for _, ok in seen)
    # The next plan's estimate quotes the rate this rebuild measured: its records over its
    # micro-batches' time (the processor's stats), the rest of its wall time as start-up.
    meta = reader.registry.meta(result.generation)
    batch_seconds = float(meta["rebuild_batch_seconds"])
    assert 0 < batch_seconds < float(meta["rebuild_seconds"])
    assert int(meta["rebuild_events"]) == len(events)
    again = plan_replay(spec, ToEarliest(), world.kafka, world.client, world.redis.key_prefix)
    estimate = next(c for c in again.checks if c.name == "estimate").detail
    rate = len(events) / batch_seconds
    assert f" at {rate:,.0f} records/s (measured by the rebuild of g{result.generation}: " in (
        estimate
    )
