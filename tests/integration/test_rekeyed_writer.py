"""Re-keyed writer slots on real Redis and a real broker, without Spark: any chunking, any slot
order, a slot far behind the others (a crash mid-batch): state == oracle, positions == the
slots' minimum, no record refused that the oracle accepts."""

from __future__ import annotations

import dataclasses

import pytest

from refold.contracts.codec import EventCodec
from refold.contracts.commerce import ORDERS
from refold.contracts.layout import position_field
from refold.contracts.store.connect import redis_client
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.customer_stats.projection import CustomerStatsProjection
from refold.processors.fold.oracle import fold_all
from refold.processors.fold.records import SourceRecord
from refold.processors.fold.rekey import KeyResolver
from refold.processors.runtime.envelope import BatchOutcome, FoldTarget, FoldWriter
from refold.services.reader.state_reader import StateReader
from tests.support.topics import publish, source_records

P = CustomerStatsProjection()
SLOTS = 3


@pytest.fixture
def orders(kafka_bootstrap, make_topic):
    """A topic of simulated orders, its events as published and its records as read back."""
    topic = make_topic(partitions=ORDERS.partitions, prefix="orders")
    events = list(OrderSimulator(300, seed=61))
    publish(kafka_bootstrap, ORDERS, topic, events)
    records, _ends = source_records(kafka_bootstrap, topic, ORDERS.partitions)
    return topic, events, records


def _target(redis_url, kafka_bootstrap, make_topic, unique, topic) -> FoldTarget:
    return FoldTarget(
        "customer_stats",
        1,
        redis_url,
        f"test-{unique}",
        (("bootstrap.servers", kafka_bootstrap),),
        make_topic(partitions=1, prefix="dlq"),
        slots=SLOTS,
        key_field="customer_id",
        key_links=("order_id",),
        partition_keys=((topic, "order_id"),),
    )


def _start(target: FoldTarget, topic: str) -> None:
    """What the runner does before a generation's first batch: every slot starts at 0."""
    applied = target.positions(redis_client(target.redis_url))
    applied.set({position_field(topic, p): 0 for p in range(8)})


def _apply(writer: FoldWriter, records: list[SourceRecord], chunk: int) -> BatchOutcome:
    writer.begin_task()
    outcome = BatchOutcome()
    for i in range(0, len(records), chunk):
        outcome.merge(writer.apply(records[i : i + chunk], batch_id=0))
    return outcome


def _check(target, events, records, outcomes):
    expected = fold_all(P, events, KeyResolver("customer_id", ("order_id",)))
    reader = StateReader.from_url(target.redis_url, "customer_stats", target.key_prefix)
    assert dict(reader.scan("customers", generation=1)) == expected.states
    assert reader.aggregate("customer_totals", generation=1).value == dict(expected.aggregate)
    assert sum(o.rejected for o in outcomes) == len(expected.rejected)
    assert sum(o.applied for o in outcomes) == len(events) - len(expected.rejected)
    client = redis_client(target.redis_url)
    positions = {k.decode(): int(v) for k, v in client.hgetall(target.keys.positions).items()}
    ends = {position_field(r.topic, r.partition): r.offset + 1 for r in records}
    assert positions == ends


def test_slots_in_any_chunking_and_order_equal_the_oracle(
    orders, redis_url, kafka_bootstrap, make_topic, unique
):
    topic, events, records = orders
    target = _target(redis_url, kafka_bootstrap, make_topic, unique, topic)
    _start(target, topic)
    writers = [FoldWriter(target, P, slot=s) for s in range(SLOTS)]
    outcomes = [
        _apply(writers[2], records, 97),
        _apply(writers[0], records, 10_000),
        _apply(writers[1], records, 13),
        _apply(writers[1], records, 500),  # a re-executed task changes nothing
    ]
    assert outcomes[-1].applied == 0
    _check(target, events, records, outcomes)


def test_a_slot_far_behind_the_others_resolves_alike(
    orders, redis_url, kafka_bootstrap, make_topic, unique
):
    """Slot 0 runs ahead into the second half while the others have applied nothing (a crash
    mid-batch): links made in the first half for the other slots' customers are not in Redis
    yet, so slot 0 reads them from the log before it decides an event has no customer."""
    topic, events, records = orders
    target = _target(redis_url, kafka_bootstrap, make_topic, unique, topic)
    _start(target, topic)
    writers = [FoldWriter(target, P, slot=s) for s in range(SLOTS)]
    half = {p: max(r.offset for r in records if r.partition == p) // 2 for p in range(8)}
    first = [r for r in records if r.offset < half[r.partition]]
    second = [r for r in records if r.offset >= half[r.partition]]
    outcomes = [_apply(writers[0], first, 200)]
    # A new task of slot 0 on the second half: its records start above the others' positions.
    outcomes.append(_apply(writers[0], second, 200))
    outcomes += [_apply(writers[1], records, 300), _apply(writers[2], records, 300)]
    _check(target, events, records, outcomes)


def test_records_that_cannot_be_folded_are_dead_lettered_once_by_one_slot(
    orders, redis_url, kafka_bootstrap, make_topic, unique
):
    """Undecodable records and records off their partition key, with and without a link for
    their Kafka key: exactly one slot owns each (the link's slot, else the key's CRC)."""
    topic, events, records = orders
    codec = EventCodec()
    placed = next(e for t, e in events if t == "OrderPlaced")
    paid = {
        "event_id": "bad-paid",
        "order_id": "ord-elsewhere",
        "amount_minor": 1,
        "currency": "EUR",
        "payment_method": "CARD",
        "paid_at": 1,
    }
    last = max(r.offset for r in records if r.partition == 0)
    bad = [
        # Kafka key linked to a customer (its order was placed), bytes that do not decode.
        SourceRecord(topic, 0, last + 1, placed["order_id"].encode(), b"\xc3\x01garbage"),
        # Kafka key without a link, not Avro at all.
        SourceRecord(topic, 0, last + 2, b"ord-unknown", b"not avro"),
        # A valid OrderPaid under another order's key (off its partition key's partition).
        SourceRecord(
            topic, 0, last + 3, placed["order_id"].encode(), codec.encode("OrderPaid", paid)
        ),
    ]
    target = _target(redis_url, kafka_bootstrap, make_topic, unique, topic)
    _start(target, topic)
    writers = [FoldWriter(target, P, slot=s) for s in range(SLOTS)]
    outcomes = [_apply(w, [*records, *bad], 150) for w in writers]
    expected = fold_all(P, events, KeyResolver("customer_id", ("order_id",)))
    refused = sum(o.rejected + o.undecodable for o in outcomes)
    assert refused == len(expected.rejected) + len(bad)
    assert sum(o.undecodable for o in outcomes) == 2


def test_slots_fold_again_what_redis_lost(orders, redis_url, kafka_bootstrap, make_topic, unique):
    """Redis restored from an older backup under running slots: each slot's next records
    start above its restored position, so it reads the lost range from the log and folds it
    again (with the links it held), before the records that follow."""
    topic, events, records = orders
    target = _target(redis_url, kafka_bootstrap, make_topic, unique, topic)
    _start(target, topic)
    writers = [FoldWriter(target, P, slot=s) for s in range(SLOTS)]
    last = {p: max(r.offset for r in records if r.partition == p) for p in range(8)}
    thirds = [
        [
            r
            for r in records
            if k * (last[r.partition] + 1) // 3 <= r.offset < (k + 1) * (last[r.partition] + 1) // 3
        ]
        for k in range(3)
    ]
    outcomes = [_apply(w, thirds[0], 100) for w in writers]
    client = redis_client(redis_url)
    backup = {k: client.dump(k) for k in client.scan_iter(match=target.keys.pattern())}
    lost = [_apply(w, thirds[1], 100) for w in writers]
    assert sum(o.applied for o in lost) > 0
    # The restore: every key back to the backup, the second third's writes gone.
    client.delete(*client.scan_iter(match=target.keys.pattern()))
    for key, value in backup.items():
        client.restore(key, 0, value)
    outcomes += [_apply(w, thirds[2], 100) for w in writers]  # these fold the lost third too
    _check(target, events, records, outcomes)


def test_the_generation_reads_as_far_as_its_slowest_slot(
    orders, redis_url, kafka_bootstrap, make_topic, unique
):
    """Positions and batch id as readers see them: the slots' minimum, in one read."""
    topic, _events, records = orders
    target = _target(redis_url, kafka_bootstrap, make_topic, unique, topic)
    _start(target, topic)
    applied = target.positions(redis_client(redis_url))
    start = {(topic, p): 0 for p in range(8)}
    assert applied.read() == (start, None)
    writers = [FoldWriter(target, P, slot=s) for s in range(SLOTS)]
    half = len(records) // 2
    for writer in writers:
        writer.begin_task()
        writer.apply(records[:half], batch_id=0)
    for writer in writers[:2]:  # slot 2 has not applied batch 1 yet
        writer.begin_task()
        writer.apply(records[half:], batch_id=1)
    middle = start | {(r.topic, r.partition): r.offset + 1 for r in records[:half]}
    assert applied.read() == (middle, 0)
    writers[2].begin_task()
    writers[2].apply(records[half:], batch_id=1)
    ends = start | {(r.topic, r.partition): r.offset + 1 for r in records}
    assert applied.read() == (ends, 1)
    # Without its slots, the generation's own hash: the same positions, no batch id of its own.
    assert dataclasses.replace(applied, slots=0).read() == (ends, None)
