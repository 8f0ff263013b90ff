"""Snapshots, seeded plans and plan checks, on a real broker and a real Redis.

The generations are written by the real fold writer (the processor's write path) without Spark;
the Spark processor running a seeded rebuild end to end is in tests/spark. The exception:
``replay --execute`` run as a process and stopped by SIGTERM, which starts the real processor.
"""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import zlib
from datetime import UTC, datetime
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from refold.contracts.codec import EventCodec
from refold.contracts.commerce import ORDERS
from refold.contracts.layout import position_field
from refold.contracts.processors import consumer_group
from refold.contracts.registry import processor_spec
from refold.contracts.settings import KafkaSettings, RedisSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import SLOTS_FIELD, GenerationRegistry
from refold.contracts.store.lease import GenerationLease, lease_holder_alive
from refold.contracts.store.stats import ProcessorStats
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.errors import ProcessorConfigError
from refold.processors.fold.oracle import fold_all
from refold.processors.fold.records import SourceRecord
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from refold.processors.runtime.runner import RunOptions, resolve_run
from refold.replay.__main__ import main as replay
from refold.replay.errors import PlanError
from refold.replay.generations_admin import diff_generations
from refold.replay.in_place import reset_in_place
from refold.replay.plan import (
    ByDuration,
    FromFile,
    FromOffset,
    ToDatetime,
    ToEarliest,
    parse_datetime,
    parse_duration,
)
from refold.replay.rebuild import plan_replay, run_rebuild
from refold.replay.snapshots import SnapshotError, SnapshotStore
from refold.services.producer.publisher import EventPublisher
from refold.services.reader.state_reader import StateReader
from tests.support.waiting import assert_eventually

PARTITIONS = 2


class World:
    """A topic holding simulated orders, and one live generation of order_state."""

    def __init__(self, kafka_bootstrap, redis_url, topic, prefix):
        self.topic = topic
        self.prefix = prefix
        self.kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
        self.redis_url = redis_url
        self.client = redis_client(redis_url)
        self.registry = GenerationRegistry.of(self.client, "order_state", prefix)
        self.reader = StateReader(self.client, "order_state", prefix)
        self.codec = EventCodec()
        self.events = list(OrderSimulator(120, seed=11, anomaly_rate=0))
        self.records = self._produce()
        self.live = self.registry.create({"topics": [topic]}, live=True)

    def _produce(self):
        producer = Producer({"bootstrap.servers": self.kafka.bootstrap_servers, "linger.ms": 5})
        records, counts = [], [0] * PARTITIONS
        for event_type, event in self.events:
            # crc32, not hash(): the same partitions whatever PYTHONHASHSEED is.
            partition = zlib.crc32(event["order_id"].encode()) % PARTITIONS
            value = self.codec.encode(event_type, event)
            producer.produce(self.topic, value, event["order_id"].encode(), partition=partition)
            records.append(
                SourceRecord(
                    self.topic, partition, counts[partition], event["order_id"].encode(), value
                )
            )
            counts[partition] += 1
        assert producer.flush(30) == 0
        return records

    def writer(self, generation, projection=None, *, slot=None, slots=0):
        target = FoldTarget(
            "order_state",
            generation,
            self.redis_url,
            self.prefix,
            (("bootstrap.servers", self.kafka.bootstrap_servers),),
            f"{self.topic}.dlq",
            slots=slots,
            key_field="order_id",
            partition_keys=((self.topic, "order_id"),),
        )
        return FoldWriter(target, projection or OrderStateProjection(), slot=slot)

    def oracle(self, positions):
        """The fold of every record below ``positions`` (per partition)."""
        wanted = [
            (event_type, event)
            for record, (event_type, event) in zip(self.records, self.events, strict=True)
            if record.offset < positions.get((record.topic, record.partition), 0)
        ]
        return fold_all(OrderStateProjection(), wanted)

    def state(self, generation):
        return dict(self.reader.scan("orders", generation))


@pytest.fixture
def world(kafka_bootstrap, redis_url, make_topic, unique, monkeypatch, tmp_path):
    topic = make_topic(partitions=PARTITIONS, prefix="orders")
    prefix = f"test-{unique}"
    for key, value in {
        "REFOLD_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "REFOLD_REDIS__URL": redis_url,
        "REFOLD_REDIS__KEY_PREFIX": prefix,
        "REFOLD_STATE_DIR": str(tmp_path),
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(
        "refold.replay.rebuild.processor_topics", lambda _spec, _registry: [topic], raising=True
    )
    return World(kafka_bootstrap, redis_url, topic, prefix)


def test_a_snapshot_taken_while_batches_commit_is_consistent(world):
    """Each snapshot's state equals the oracle fold up to the snapshot's own positions."""
    store = SnapshotStore(world.registry)
    writer = world.writer(world.live)
    chunks = [world.records[i : i + 25] for i in range(0, len(world.records), 25)]
    writer.apply(chunks[0])
    done = threading.Event()
    snapshots = []

    def keep_writing():
        for index, chunk in enumerate(chunks[1:]):
            taken = len(snapshots)
            writer.apply(chunk)
            time.sleep(0.01)  # spread the commits so that snapshots land between them
            # Every other commit waits for a snapshot after it (bounded), so that snapshots land
            # mid-stream on a loaded machine too; the others race the snapshots' copies.
            deadline = time.monotonic() + 5
            while index % 2 == 0 and len(snapshots) == taken and time.monotonic() < deadline:
                time.sleep(0.001)
        done.set()

    thread = threading.Thread(target=keep_writing)
    thread.start()
    while not done.is_set() or not snapshots:
        snapshots.append(store.take(world.live))
    thread.join()
    assert len({sum(s.positions.values()) for s in snapshots}) > 1  # taken mid-stream
    for snapshot in snapshots[:: max(1, len(snapshots) // 4)]:
        seeded = world.registry.create({"topics": [world.topic]})
        store.seed(snapshot, seeded)
        expected = world.oracle(snapshot.positions)
        assert world.registry.positions(seeded)[0] == snapshot.positions
        assert world.state(seeded) == expected.states
        assert world.reader.aggregate("order_totals", seeded).value == dict(expected.aggregate)
    assert [s.name for s in store.list(world.live)] == [s.name for s in snapshots]


def test_a_seeded_plan_starts_at_the_snapshot_and_rebuilds_the_same_state(world):
    writer = world.writer(world.live)
    half = len(world.records) // 2
    writer.apply(world.records[:half])
    store = SnapshotStore(world.registry)
    snapshot = store.take(world.live)
    writer.apply(world.records[half:])  # the live generation moves on

    spec = processor_spec("order_state")
    targets = dict(snapshot.positions)
    plan = plan_replay(spec, FromFile(targets, "snap.csv"), world.kafka, world.client, world.prefix)
    assert plan.seed is not None
    assert plan.seed.name == snapshot.name
    assert plan.ready, plan.render()
    assert plan.total_events == len(world.records) - half
    assert "seeded from snapshot" in plan.render()

    # What the shadow processor does: start from the seed, fold the rest of the log.
    rebuilt = world.registry.create({"topics": [world.topic]})
    store.seed(snapshot, rebuilt)
    outcome = world.writer(rebuilt).apply(world.records)  # below the seed: skipped
    assert outcome.skipped == half
    diff = diff_generations(spec, world.client, world.prefix, world.live, rebuilt)
    assert diff.identical, diff.render()


def test_seeding_from_a_snapshot_that_lost_keys_fails_loudly(world):
    world.writer(world.live).apply(world.records)
    store = SnapshotStore(world.registry)
    snapshot = store.take(world.live)
    copied = f"{world.registry.keys(world.live).base}:snap:{snapshot.snapshot}:*"
    world.client.delete(next(world.client.scan_iter(match=copied, count=1000)))
    with pytest.raises(SnapshotError, match="keys left"):
        store.seed(snapshot, world.registry.create({"topics": [world.topic]}))


def test_a_rebuild_that_skips_records_without_a_snapshot_is_refused(world, capsys):
    world.writer(world.live).apply(world.records)
    spec = processor_spec("order_state")
    plan = plan_replay(spec, FromOffset(5), world.kafka, world.client, world.prefix)
    assert not plan.ready
    state = next(c for c in plan.checks if c.name == "state")
    assert not state.ok
    assert "replay snapshot" in state.action
    generations = world.registry.list()
    with pytest.raises(PlanError, match="failed its checks"):
        run_rebuild(
            plan,
            spec,
            world.kafka,
            RedisSettings(url=world.redis_url, key_prefix=world.prefix),
            state_dir=Path(os.environ["REFOLD_STATE_DIR"]),
        )
    assert world.registry.list() == generations  # nothing was created
    assert replay(["--processor", "order_state", "--from-offset", "5", "--execute"]) == 1
    captured = capsys.readouterr()
    assert "FAIL state" in captured.out
    assert "replay snapshot --processor order_state" in captured.err


def test_the_decode_check_reports_unknown_fingerprints_and_garbage(world):
    producer = Producer({"bootstrap.servers": world.kafka.bootstrap_servers})
    unknown = b"\xc3\x01" + bytes.fromhex("0123456789abcdef") + b"\x00"
    producer.produce(world.topic, unknown, b"k", partition=0)
    producer.produce(world.topic, b"{not avro}", b"k", partition=1)
    assert producer.flush(30) == 0
    spec = processor_spec("order_state")
    plan = plan_replay(spec, ToEarliest(), world.kafka, world.client, world.prefix)
    decode = next(c for c in plan.checks if c.name == "decode")
    assert not decode.ok
    assert "unknown fingerprint 0123456789abcdef (1 records)" in decode.detail
    assert "1 records are neither Avro single-object encoded nor registry framed" in decode.detail
    assert "OrderPlaced v" in decode.detail
    assert "--accept-dead-letters" in decode.action
    accepted = plan_replay(
        spec, ToEarliest(), world.kafka, world.client, world.prefix, accept_dead_letters=True
    )
    assert accepted.ready
    unscanned = plan_replay(
        spec, ToEarliest(), world.kafka, world.client, world.prefix, scan_limit=0
    )
    assert "not scanned" in next(c for c in unscanned.checks if c.name == "decode").detail


def test_the_estimate_quotes_the_rate_a_past_rebuild_measured_and_says_how(world):
    """A rebuild recorded its records, wall time and micro-batch time; the plan divides them."""
    spec = processor_spec("order_state")
    # A rebuild recorded before the batch time was kept: 51,020 records in 8.6 s, and a
    # "rebuild_rate" that was its record count (it divided by the wall time less 20 s, floored).
    old = world.registry.create({"topics": [world.topic]})
    world.registry.update_meta(
        old, {"rebuild_events": "51020", "rebuild_seconds": "8.6", "rebuild_rate": "51020"}
    )
    estimate = next(
        c
        for c in plan_replay(spec, ToEarliest(), world.kafka, world.client, world.prefix).checks
        if c.name == "estimate"
    )
    assert "51,020 records/s" not in estimate.detail
    assert f"at 5,933 records/s (measured by the rebuild of g{old}: 51,020 records in 8.6s" in (
        estimate.detail
    )
    # A newer rebuild, measured by its processor's stats: the newest one counts.
    new = world.registry.create({"topics": [world.topic]})
    world.registry.update_meta(
        new,
        {"rebuild_events": "1000", "rebuild_seconds": "7.5", "rebuild_batch_seconds": "0.5"},
    )
    estimate = next(
        c
        for c in plan_replay(spec, ToEarliest(), world.kafka, world.client, world.prefix).checks
        if c.name == "estimate"
    )
    assert estimate.detail == (
        f"{len(world.records)} records at 2,000 records/s (measured by the rebuild of g{new}: "
        "1,000 records in 0.5s of micro-batches (the processor's stats) after 7.0s of "
        f"start-up): about {7.0 + len(world.records) / 2000:,.0f}s including start-up"
    )


def test_snapshot_cli_takes_and_lists_snapshots(world, capsys):
    with pytest.raises(SnapshotError, match="applied nothing"):
        SnapshotStore(world.registry).take(world.live)
    world.writer(world.live).apply(world.records)
    assert replay(["snapshot", "--processor", "order_state"]) == 0
    assert f"g{world.live}/s1" in capsys.readouterr().out
    assert replay(["snapshot", "--processor", "order_state", "--list"]) == 0
    out = capsys.readouterr().out
    assert f"g{world.live}/s1" in out
    assert str(len(world.records)) in out


def _group_offsets(world, group):
    admin = AdminClient({"bootstrap.servers": world.kafka.bootstrap_servers})
    request = [ConsumerGroupTopicPartitions(group)]
    result = next(iter(admin.list_consumer_group_offsets(request).values())).result()
    return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions}


def test_in_place_reset_is_refused_while_a_processor_holds_the_generation(world, capsys):
    world.writer(world.live).apply(world.records)
    before = world.state(world.live)
    lease = GenerationLease(world.registry, world.live)
    lease.acquire(0)  # this process stands for a running processor
    try:
        argv = ["--processor", "order_state", "--to-earliest", "--in-place", "--execute"]
        assert replay(argv) == 1
        assert "being processed by" in capsys.readouterr().err
    finally:
        lease.release()
    assert world.state(world.live) == before


def test_in_place_reset_is_refused_while_the_consumer_group_has_live_members(world):
    world.writer(world.live).apply(world.records)
    before = world.state(world.live)
    group = consumer_group("order_state", world.live, world.prefix)
    member = Consumer(
        {
            "bootstrap.servers": world.kafka.bootstrap_servers,
            "group.id": group,
            "session.timeout.ms": 6000,  # tansu.md: joins are held for session.timeout.ms/2
            "heartbeat.interval.ms": 1000,
            "enable.auto.commit": False,
        }
    )
    member.subscribe([world.topic])
    try:
        deadline = time.monotonic() + 60
        while not member.assignment():
            assert time.monotonic() < deadline, "the member never joined"
            member.poll(0.2)
        spec = processor_spec("order_state")
        plan = plan_replay(spec, ToEarliest(), world.kafka, world.client, world.prefix)
        with pytest.raises(PlanError, match=f"refused to move consumer group {group}"):
            reset_in_place(plan, world.kafka, world.client, world.prefix)
    finally:
        member.close()
    assert world.state(world.live) == before


def test_in_place_reset_rewinds_state_group_and_checkpoint(world):
    writer = world.writer(world.live)
    writer.apply(world.records)
    stats = ProcessorStats(world.client, world.registry.layout)
    stats.record_batch(world.live, 9, 40, 0, 0, {}, 10.0, None, now_ms=1)
    spec = processor_spec("order_state")
    plan = plan_replay(spec, ToEarliest(), world.kafka, world.client, world.prefix)
    done = reset_in_place(plan, world.kafka, world.client, world.prefix)
    assert stats.read(world.live).batches == 0  # batch ids start again with the new epoch
    assert done.generation == world.live
    assert done.keys_removed > len(world.oracle({}).states)
    assert world.state(world.live) == {}
    assert world.registry.positions(world.live)[0] == {(world.topic, p): 0 for p in range(2)}
    assert _group_offsets(world, done.group) == {(world.topic, p): 0 for p in range(2)}
    assert done.checkpoint_epoch == 1
    assert world.registry.meta(world.live)["checkpoint_epoch"] == "1"
    # Folding again from the start rebuilds the same state, exactly once.
    outcome = world.writer(world.live).apply(world.records)
    assert outcome.skipped == 0
    expected = world.oracle({(world.topic, p): 10**9 for p in range(2)})
    assert world.state(world.live) == expected.states


def test_in_place_reset_of_a_re_keyed_generation_moves_every_slot(world):
    """A generation with writer slots: the reset rewinds each slot's positions with the
    generation's, and the slots fold it again exactly once."""
    world.registry.update_meta(world.live, {SLOTS_FIELD: "2"})
    for slot in range(2):
        writer = world.writer(world.live, slot=slot, slots=2)
        writer.begin_task()
        writer.apply(world.records)
    ends = {(world.topic, p): 10**9 for p in range(2)}
    assert world.state(world.live) == world.oracle(ends).states
    plan = plan_replay(
        processor_spec("order_state"), ToEarliest(), world.kafka, world.client, world.prefix
    )
    reset_in_place(plan, world.kafka, world.client, world.prefix)
    keys = world.registry.keys(world.live)
    zero = {position_field(world.topic, p).encode(): b"0" for p in range(2)}
    assert world.state(world.live) == {}
    assert world.client.hgetall(keys.positions) == zero
    assert [world.client.hgetall(keys.slot_positions(s)) for s in range(2)] == [zero, zero]
    for slot in range(2):
        writer = world.writer(world.live, slot=slot, slots=2)
        writer.begin_task()
        assert writer.apply(world.records).skipped == 0
    assert world.state(world.live) == world.oracle(ends).states
    applied = world.registry.positions(world.live)[0]
    assert sum(applied.values()) == len(world.records)


def test_a_processor_refuses_a_generation_whose_in_place_reset_did_not_finish(
    world, monkeypatch, tmp_path
):
    world.writer(world.live).apply(world.records)
    spec = processor_spec("order_state")
    plan = plan_replay(spec, ToEarliest(), world.kafka, world.client, world.prefix)

    def crash(*_args):
        msg = "the reset died here"
        raise RuntimeError(msg)

    with monkeypatch.context() as patch:
        patch.setattr("refold.replay.in_place._reset_state", crash)
        with pytest.raises(RuntimeError, match="died"):
            reset_in_place(plan, world.kafka, world.client, world.prefix)
    run = {
        "projection": OrderStateProjection(),
        "topics": [dataclasses.replace(ORDERS, name=world.topic, partitions=PARTITIONS)],
        "kafka": world.kafka,
        "redis_settings": RedisSettings(url=world.redis_url, key_prefix=world.prefix),
        "options": RunOptions(checkpoint_root=tmp_path / "checkpoints"),
        "client": world.client,
    }
    with pytest.raises(ProcessorConfigError, match="half reset"):
        resolve_run(**run)
    assert world.registry.meta(world.live)["checkpoint_epoch"] == "1"
    # Running the reset again finishes it, and the processor starts from the rewound positions.
    reset_in_place(plan, world.kafka, world.client, world.prefix)
    resumed = resolve_run(**run)
    assert resumed.checkpoint.endswith(f"/g{world.live}-reset2")
    assert json.loads(resumed.starting_offsets) == {world.topic: {"0": 0, "1": 0}}


def _notices(world, topic):
    consumer = Consumer(
        {
            "bootstrap.servers": world.kafka.bootstrap_servers,
            "group.id": "test-notices",
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(4)])
    notices, done = [], set()
    deadline = time.monotonic() + 30
    while len(done) < 4 and time.monotonic() < deadline:
        for message in consumer.consume(1000, timeout=0.5):
            if message.error() is not None:
                done.add(message.partition())
                continue
            headers = dict(message.headers() or [])
            notices.append((json.loads(message.value()), int(headers["refold.generation"])))
    consumer.close()
    return notices


def test_side_effects_go_out_live_and_are_suppressed_while_replaying(world, make_topic):
    notifications = make_topic(partitions=4, prefix="notices")
    projection = OrderStateProjection(notifications)
    shipped = sorted(
        k
        for k, s in world.oracle({(world.topic, p): 10**9 for p in range(2)}).states.items()
        if s["status"] == "shipped"
    )
    assert shipped
    live = world.writer(world.live, projection).apply(world.records)
    assert (live.effects, live.suppressed) == (len(shipped), 0)

    rebuilding = world.registry.create({"topics": [world.topic]})  # what replay creates
    shadow = world.writer(rebuilding, projection).apply(world.records)
    assert (shadow.effects, shadow.suppressed) == (0, len(shipped))

    notices = _notices(world, notifications)
    assert sorted(n["order_id"] for n, _g in notices) == shipped
    assert {g for _n, g in notices} == {world.live}
    assert all(n["type"] == "order-shipped" for n, _g in notices)


def test_a_rebuild_sends_the_effects_of_records_the_live_generation_has_not_applied(
    world, make_topic
):
    """At the cutover the shadow is ahead of the live processor: those effects must go out."""
    notifications = make_topic(partitions=4, prefix="notices")
    projection = OrderStateProjection(notifications)
    half = {(world.topic, p): sum(r.partition == p for r in world.records) // 2 for p in range(2)}
    early = [r for r in world.records if r.offset < half[(r.topic, r.partition)]]
    everything = {(world.topic, p): 10**9 for p in range(2)}

    def shipped(positions):
        return {k for k, s in world.oracle(positions).states.items() if s["status"] == "shipped"}

    live = world.writer(world.live, projection).apply(early)
    assert live.effects == len(shipped(half)) > 0
    shadow = world.writer(world.registry.create({"topics": [world.topic]}), projection)
    outcome = shadow.apply(world.records)
    # Orders ship once: those shipped by the first half went out from the live generation.
    assert (outcome.suppressed, outcome.effects) == (
        len(shipped(half)),
        len(shipped(everything) - shipped(half)),
    )
    notices = _notices(world, notifications)
    assert {n["order_id"] for n, _g in notices} == shipped(everything)
    assert {n["order_id"] for n, g in notices if g != world.live} == (
        shipped(everything) - shipped(half)
    )


def test_a_partition_with_nothing_to_replay_does_not_hold_the_cutover_back(world):
    """A shadow starting at a partition's end never writes a position there (log start == end)."""
    world.writer(world.live).apply(world.records)
    ends = {(world.topic, p): sum(r.partition == p for r in world.records) for p in range(2)}
    shadow = world.registry.create({"topics": [world.topic]})
    world.writer(shadow).apply([r for r in world.records if r.partition == 0])
    flipped, _previous, behind = world.registry.flip_if_caught_up(shadow, ends)
    assert not flipped
    assert behind == {(world.topic, 1): ends[(world.topic, 1)]}
    starts = {(world.topic, 0): 0, (world.topic, 1): ends[(world.topic, 1)]}
    assert world.registry.flip_if_caught_up(shadow, ends, starts=starts) == (True, world.live, {})
    assert world.registry.live() == shadow


def test_time_specs_resolve_against_record_timestamps(
    kafka_bootstrap, redis_url, make_topic, unique, monkeypatch
):
    topic = make_topic(partitions=2, prefix="timed")
    monkeypatch.setattr("refold.replay.rebuild.processor_topics", lambda _spec, _registry: [topic])
    base = 1_767_225_600_000  # 2026-01-01T00:00:00Z
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 20})
    for i in range(40):  # partition 0: a record a second; partition 1: one every 10 s
        producer.produce(topic, b"x", timestamp=base + i * 1000, partition=0)
        producer.produce(topic, b"y", timestamp=base + i * 10_000, partition=1)
    assert producer.flush(30) == 0
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    client = redis_client(redis_url)
    spec = processor_spec("order_state")

    def targets(reset):
        plan = plan_replay(spec, reset, kafka, client, f"test-{unique}", scan_limit=0)
        return {r.partition: r.target for r in plan.partitions}

    when = datetime(2026, 1, 1, 0, 0, 25, tzinfo=UTC)
    assert targets(ToDatetime(when)) == {0: 25, 1: 3}
    assert targets(ToDatetime(parse_datetime("2026-01-01T01:00:25+01:00"))) == {0: 25, 1: 3}
    now = datetime(2026, 1, 1, 0, 5, tzinfo=UTC)  # 5 min after the first record
    assert targets(ByDuration(parse_duration("PT4M50S"), now)) == {0: 10, 1: 1}
    assert targets(ByDuration(parse_duration("PT1M"), now)) == {0: 40, 1: 24}


_REPLAY_EXECUTE = ("--processor", "order_state", "--to-earliest", "--execute", "--no-progress")


def _start_replay(env, out_path):
    """``python -m refold.replay --processor order_state --to-earliest --execute`` as a process."""
    with out_path.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "refold.replay", *_REPLAY_EXECUTE],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=Path(__file__).resolve().parents[2],
        )


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.spark  # also: it runs the real processor
def test_sigterm_stops_the_rebuild_processor_and_leaves_readers_on_the_live_generation(
    kafka_bootstrap, redis_url, make_topic, unique, tmp_path
):
    """``kill <replay>`` mid-rebuild: the processor's whole process group ends with the replay.

    Runs the real Spark processor (as replay does): ~10 s per start on a 2-core machine.
    """
    topic = make_topic(partitions=ORDERS.partitions, prefix="orders")  # what the processor checks
    prefix = f"test-{unique}"
    env = {
        **os.environ,
        "REFOLD_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "REFOLD_REDIS__URL": redis_url,
        "REFOLD_REDIS__KEY_PREFIX": prefix,
        "REFOLD_STATE_DIR": str(tmp_path),
        "REFOLD_ORDER_STATE__TOPICS": json.dumps([topic]),
        "REFOLD_ORDER_STATE__DEAD_LETTER_TOPIC": make_topic(partitions=1, prefix="dlq"),
        "REFOLD_ORDER_STATE__NOTIFICATIONS_TOPIC": f"{topic}.notifications",
    }
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    events = list(OrderSimulator(120, seed=11, anomaly_rate=0))  # ~1,200 records
    publisher = EventPublisher(kafka, topics=[dataclasses.replace(ORDERS, name=topic)])
    publisher.emit_many(events)
    publisher.close()
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, "order_state", prefix)
    live = registry.create({"topics": [topic]}, live=True)  # readers' generation, never changed
    building = live + 1
    out_path = tmp_path / "replay.out"

    def log_tail():
        logs = [out_path, tmp_path / "logs" / f"order_state-g{building}.log"]
        return "\n".join(
            f"--- {path.name}:\n" + "\n".join(path.read_text(errors="replace").splitlines()[-25:])
            for path in logs
            if path.exists()
        )

    def folding():
        """The lease holder (the processor's driver) once it has applied a first batch."""
        owner = registry.lease_owner(building)
        applied = sum(registry.positions(building)[0].values())
        if registry.status(building) == "building" and owner and 0 < applied < len(events):
            return owner
        return None

    # Small batches: still folding when the signal comes (~25 batches), as a long rebuild is.
    replay_process = _start_replay(
        {**env, "REFOLD_ORDER_STATE__MAX_OFFSETS_PER_TRIGGER": "50"}, out_path
    )
    driver = group = None
    try:
        owner = assert_eventually(
            folding,
            timeout=120,
            interval=0.05,
            message=log_tail,
            alive=lambda: replay_process.poll() is None,
        )
        driver = int(owner.split(":")[1])  # host:pid:nonce
        group = os.getpgid(driver)
        replay_process.send_signal(signal.SIGTERM)
        assert replay_process.wait(60) == 128 + signal.SIGTERM, log_tail()
        output = out_path.read_text()
        assert "interrupted by SIGTERM" in output
        assert f"stopped the rebuild processor of g{building} (pid {driver}" in output
        assert f"readers stay on g{live}; g{building} is left building" in output
        # The driver, its JVM and its Python workers: nothing of the group is left.
        assert_eventually(lambda: not _pid_alive(driver), timeout=10, message=log_tail)
        assert group == driver, "the processor must lead a process group of its own"
        assert_eventually(lambda: not _group_alive(group), timeout=10, message=log_tail)
    finally:
        if replay_process.poll() is None:
            replay_process.kill()
            replay_process.wait()
        if driver is not None and _pid_alive(driver):  # only when the test failed
            if group == driver:
                os.killpg(group, signal.SIGKILL)
            else:
                os.kill(driver, signal.SIGKILL)  # its JVM exits with it
    holder = registry.lease_owner(building)
    assert holder is None or not lease_holder_alive(holder)  # released, or taken over later
    assert registry.live() == live  # readers never moved
    assert registry.status(building) == "building"

    # A later replay is not held up by the interrupted one: it builds g3 and cuts over.
    again = _start_replay(env, out_path)
    try:
        assert again.wait(300) == 0, log_tail()
    finally:
        if again.poll() is None:  # stops its processor too (what this test is about)
            again.send_signal(signal.SIGTERM)
            again.wait(60)
    rebuilt = registry.live()
    assert rebuilt == building + 1
    expected = fold_all(OrderStateProjection(), events)
    reader = StateReader(client, "order_state", prefix)
    assert dict(reader.scan("orders", rebuilt)) == expected.states
