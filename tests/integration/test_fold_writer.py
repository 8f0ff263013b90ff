"""FoldWriter against real Redis and a real broker (for dead letters), without Spark."""

import asyncio
import threading
import zlib

import pytest
import redis
from confluent_kafka import Consumer, TopicPartition

from refold.contracts.codec import EventCodec
from refold.contracts.store.connect import async_redis_client, redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.store.stats import ProcessorStats
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.errors import SinkConflictError
from refold.processors.fold.oracle import fold_all
from refold.processors.fold.records import SourceRecord
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.envelope import FoldWriter
from refold.services.reader.state_reader import StateReader

P = OrderStateProjection()


def records_for(events, partitions=4, topic="orders"):
    codec = EventCodec()
    offsets = [0] * partitions
    out = []
    for event_type, event in events:
        partition = zlib.crc32(event["order_id"].encode()) % partitions  # not hash(): seeded
        out.append(
            SourceRecord(
                topic,
                partition,
                offsets[partition],
                event["order_id"].encode(),
                codec.encode(event_type, event),
            )
        )
        offsets[partition] += 1
    return sorted(out, key=lambda r: (r.partition, r.offset))


def table_dump(client, target):
    keys = target.keys
    names = sorted(client.scan_iter(match=keys.table_pattern("orders")))
    return (
        dict(zip(names, client.mget(names), strict=True)),
        client.hgetall(keys.aggregate("order_totals")),
        client.hgetall(keys.positions),
    )


def dead_letters(bootstrap, topic, expected, timeout_polls=20):
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "t", "enable.auto.commit": "false"}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    found = []
    for _ in range(timeout_polls):
        found += [m for m in consumer.consume(100, timeout=0.5) if m.error() is None]
        if len(found) >= expected:
            break
    consumer.close()
    return found


def test_state_equals_the_oracle_and_replaying_changes_nothing(target, redis_url):
    events = list(OrderSimulator(400, seed=21, anomaly_rate=0))
    records = records_for(events)
    writer = FoldWriter(target, P)
    half = len(records) // 2
    writer.apply(records[:half], batch_id=0)
    outcome = writer.apply(records[half:], batch_id=1)
    assert outcome.skipped == 0

    oracle = fold_all(P, events)
    reader = StateReader.from_url(redis_url, "order_state", target.key_prefix)
    states = dict(reader.scan("orders", generation=1))
    assert states == oracle.states
    assert reader.aggregate("order_totals", generation=1).value == dict(oracle.aggregate)

    client = redis_client(redis_url)
    before = table_dump(client, target)
    again = writer.apply(records, batch_id=1)  # a re-executed batch, and an overlapping one
    assert again.applied == 0
    assert again.skipped == len(records)
    assert table_dump(client, target) == before
    # The counts came with the transactions: a re-executed batch counts nothing again.
    counted = ProcessorStats(client, target.layout).read(1)
    assert counted.events == len(records) - len(oracle.rejected) - oracle.passed
    assert counted.batches == 0  # the driver's part: no Spark batch here


def test_partial_overlap_applies_only_the_new_tail(target, redis_url):
    events = list(OrderSimulator(100, seed=5, anomaly_rate=0))
    records = records_for(events, partitions=1)
    writer = FoldWriter(target, P)
    writer.apply(records[:60])
    outcome = writer.apply(records[40:])
    assert outcome.skipped == 20
    assert outcome.applied == len(records) - 60
    reader = StateReader.from_url(redis_url, "order_state", target.key_prefix)
    assert dict(reader.scan("orders", generation=1)) == fold_all(P, events).states


def test_bad_records_go_to_the_dead_letter_topic_with_reason_and_origin(target, kafka_bootstrap):
    events = list(OrderSimulator(10, seed=2, anomaly_rate=0))
    good = records_for(events, partitions=1)
    n = len(good)
    bad = [
        SourceRecord("orders", 0, n, b"k1", b"not avro at all"),
        SourceRecord("orders", 0, n + 1, b"k2", b"\xc3\x01" + b"\x11" * 8 + b"\x00"),
        SourceRecord(
            "orders",
            0,
            n + 2,
            b"nope",
            EventCodec().encode(
                "OrderShipped",
                {
                    "event_id": "x",
                    "order_id": "nope",
                    "carrier": "DHL",
                    "tracking_number": "T",
                    "shipped_at": 1,
                },
            ),
        ),
    ]
    outcome = FoldWriter(target, P).apply(good + bad)
    assert (outcome.undecodable, outcome.rejected) == (2, 1)
    assert outcome.positions == {"orders/0": n + 3}
    letters = dead_letters(kafka_bootstrap, target.dlq_topic, 3)
    assert [m.value() for m in letters] == [r.value for r in bad]
    headers = [dict(m.headers()) for m in letters]
    assert [h["refold.reason"] for h in headers] == [
        b"bad-magic",
        b"unknown-fingerprint",
        b"rejected",
    ]
    assert [h["refold.origin.offset"] for h in headers] == [str(r.offset).encode() for r in bad]
    assert all(h["refold.origin.topic"] == b"orders" for h in headers)
    assert b"unknown order" in headers[2]["refold.error"]


def test_concurrent_writers_of_one_generation_apply_each_record_once(target, redis_url):
    events = list(OrderSimulator(300, seed=8, anomaly_rate=0))
    records = records_for(events, partitions=2)
    errors = []

    conflicts = []

    def run():
        try:
            writer = FoldWriter(target, P)
            for start in range(0, len(records), 97):
                while True:  # as Spark retries a failed task
                    try:
                        writer.apply(records[start : start + 97])
                        break
                    except SinkConflictError as exc:
                        conflicts.append(exc)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    reader = StateReader.from_url(redis_url, "order_state", target.key_prefix)
    oracle = fold_all(P, events)
    assert dict(reader.scan("orders", generation=1)) == oracle.states
    assert reader.aggregate("order_totals", generation=1).value == dict(oracle.aggregate)


def test_reader_follows_the_alias_flip(target, redis_url):
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, "order_state", target.key_prefix)
    first = registry.create({"note": "first"}, live=True)
    events = list(OrderSimulator(20, seed=1, anomaly_rate=0))
    FoldWriter(target, P).apply(records_for(events))
    second = registry.create({"note": "second"})
    reader = StateReader(client, "order_state", target.key_prefix)
    assert reader.live_generation() == first
    assert reader.get("orders", "ord-0000001").value["order_id"] == "ord-0000001"
    assert registry.flip(second) == first
    view = reader.get("orders", "ord-0000001")
    assert (view.generation, view.value) == (second, None)
    assert {g.generation: g.status for g in registry.list()} == {first: "retired", second: "live"}
    # The reader remembers the live generation, and sees each flip at its next read, whatever
    # the read: each checks the alias in the same command as the state it reads.
    oracle = fold_all(P, events)
    assert reader.aggregate("order_totals").generation == second
    registry.flip(first, record_replaced=False)
    many = reader.get_many("orders", ["ord-0000001", "nope"])
    assert many.generation == first
    assert many.value == {"ord-0000001": oracle.states["ord-0000001"], "nope": None}
    assert many.positions == registry.positions(first)[0] != {}
    registry.flip(second, record_replaced=False)
    assert reader.get_many("orders", ["ord-0000001"]).value == {"ord-0000001": None}
    registry.flip(first, record_replaced=False)
    totals = reader.aggregate("order_totals")
    assert (totals.generation, totals.value) == (first, dict(oracle.aggregate))


def test_an_async_read_is_the_read_and_follows_the_alias_flip(target, redis_url):
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, "order_state", target.key_prefix)
    first = registry.create({}, live=True)
    events = list(OrderSimulator(20, seed=5, anomaly_rate=0))
    FoldWriter(target, P).apply(records_for(events))
    oracle = fold_all(P, events)
    key = sorted(oracle.states)[0]
    reader = StateReader(client, "order_state", target.key_prefix)

    async def reads() -> list[tuple[int, object, dict]]:
        aclient = async_redis_client(redis_url)
        try:
            seen = []
            # The first read resolves the alias (blocking); the next ones are the script,
            # awaited, loaded again if Redis forgot it (SCRIPT FLUSH), and follow each flip.
            for step in ("first", "script", "flushed", "flipped", "back"):
                if step == "flushed":
                    await aclient.script_flush()
                if step == "flipped":
                    registry.flip(registry.create({}))
                if step == "back":
                    registry.flip(first, record_replaced=False)
                view = await reader.get_async(aclient, "orders", key)
                seen.append((view.generation, view.value, view.positions))
            return seen
        finally:
            await aclient.aclose()

    seen = asyncio.run(reads())
    positions = registry.positions(first)[0]
    assert positions != {}
    mine = (first, oracle.states[key], positions)
    assert seen == [mine, mine, mine, (first + 1, None, {}), mine]
    assert seen[0][1:] == (reader.get("orders", key).value, reader.get("orders", key).positions)


def test_a_reader_whose_redis_user_may_not_run_scripts_reads_the_same(target, redis_url, unique):
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, "order_state", target.key_prefix)
    first = registry.create({}, live=True)
    events = list(OrderSimulator(10, seed=3, anomaly_rate=0))
    FoldWriter(target, P).apply(records_for(events))
    user, password = f"reader-{unique}", f"pw-{unique}"
    client.acl_setuser(
        user,
        reset=True,
        enabled=True,
        passwords=[f"+{password}"],
        keys=["~*"],
        commands=["+@read", "+@connection", "+@transaction", "-@scripting"],
    )
    try:
        host_port = redis_url.split("://", 1)[1]
        reader = StateReader.from_url(
            f"redis://{user}:{password}@{host_port}", "order_state", target.key_prefix
        )
        with pytest.raises(redis.exceptions.NoPermissionError):
            reader.client.eval("return 1", 0)  # the premise: this user runs no script
        oracle = fold_all(P, events)
        key = sorted(oracle.states)[0]
        for _ in range(2):  # the first read resolves the alias; the next would use the script
            view = reader.get("orders", key)
            assert (view.generation, view.value) == (first, oracle.states[key])
            assert view.positions == registry.positions(first)[0] != {}
        second = registry.create({})
        registry.flip(second)
        assert reader.get("orders", key).generation == second
        registry.flip(first, record_replaced=False)
        # An async read by that user: its script is refused too, and it reads as get does.
        url = f"redis://{user}:{password}@{host_port}"
        fresh = StateReader.from_url(url, "order_state", target.key_prefix)
        assert fresh.get("orders", key).generation == first  # resolves the alias

        async def read_async():
            aclient = async_redis_client(url)
            try:
                return [await fresh.get_async(aclient, "orders", key) for _ in range(2)]
            finally:
                await aclient.aclose()

        for view in asyncio.run(read_async()):
            assert (view.generation, view.value) == (first, oracle.states[key])
            assert view.positions == registry.positions(first)[0]
    finally:
        client.acl_deluser(user)


class _PaymentsOnly(OrderStateProjection):
    """order_state's fold, declaring only what it needs here: placed and paid orders."""

    event_types = ("OrderPlaced", "OrderPaid")


def test_types_the_fold_does_not_declare_are_passed_by_not_dead_lettered(
    target, kafka_bootstrap, redis_url
):
    events = list(OrderSimulator(60, seed=8, anomaly_rate=0))
    records = records_for(events, partitions=2)
    fold = _PaymentsOnly()
    outcome = FoldWriter(target, fold).apply(records)
    undeclared = sum(1 for event_type, _e in events if event_type not in fold.event_types)
    assert undeclared > 0
    expected = fold_all(fold, events)
    assert outcome.passed == expected.passed == undeclared
    # Only the fold's own refusals (a payment the rules refuse) are dead letters.
    assert outcome.dead_letters == ({"rejected": outcome.rejected} if outcome.rejected else {})
    assert outcome.rejected == len(expected.rejected)
    assert outcome.applied + outcome.rejected + outcome.passed == len(events)
    reader = StateReader.from_url(redis_url, "order_state", target.key_prefix)
    assert dict(reader.scan("orders", generation=1)) == expected.states
    letters = dead_letters(kafka_bootstrap, target.dlq_topic, outcome.rejected + 1, 6)
    assert {dict(m.headers())["refold.reason"] for m in letters} <= {b"rejected"}
    assert len(letters) == outcome.rejected
