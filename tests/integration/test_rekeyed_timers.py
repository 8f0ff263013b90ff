"""Timers on a re-keyed processor, through the envelope, against real Redis and a real broker.

Shopping sessions per customer (``tests/support/customer_sessions.py``: a session window closed
by a timer) over orders partitioned by ``order_id``: ``OrderPaid`` carries no customer and
takes it from its order's link, so a customer's events come from every partition and three
writer slots each fold their own customers. With payments late beyond the lateness and orders
out of order within it, three runs (batch sizes 37, 450 and the whole log; the partitions
interleaved three ways; the slots in three orders) and a replay as a building generation (other
batch sizes again) each end with the oracle's states, aggregate, timers and late letters, and
each live run emits exactly the oracle's closed sessions.
"""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from refold.contracts.codec import EventCodec
from refold.contracts.commerce import ORDERS
from refold.contracts.layout import position_field
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import TimedResult, fold_timed
from refold.processors.fold.records import SourceRecord
from refold.processors.fold.rekey import KeyResolver
from refold.processors.runtime.envelope import BatchOutcome, FoldTarget, FoldWriter
from refold.services.reader.state_reader import StateReader
from tests.support.customer_sessions import CUSTOMER_SESSIONS_TIME, CustomerSessions
from tests.support.topics import interleaved, publish, read_to_end, source_records

SLOTS = 3
MINUTE = 60_000
CODEC = EventCodec()
PARTITIONS = tuple(position_field("orders", p) for p in range(ORDERS.partitions))


def _events() -> list[tuple[str, dict]]:
    """300 orders of ~90 customers over ~3 hours; every 15th payment 30 minutes behind (late
    where its partition has moved on) and every 7th order 3 minutes behind (within lateness)."""
    events = list(OrderSimulator(300, seed=41, anomaly_rate=0))
    base = min(e["placed_at"] for t, e in events if t == "OrderPlaced")
    out = []
    for n, (event_type, event) in enumerate(events):
        field = {"OrderPlaced": "placed_at", "OrderPaid": "paid_at"}.get(event_type)
        if field is not None:
            at = base + (event[field] - base) * 200
            if event_type == "OrderPaid" and n % 15 == 0:
                at -= 30 * MINUTE
            elif n % 7 == 0:
                at -= 3 * MINUTE
            event = {**event, field: at}
        out.append((event_type, event))
    return out


@pytest.fixture
def orders(kafka_bootstrap, make_topic):
    """The orders topic (8 partitions by order_id) and its records, partition by partition."""
    topic = make_topic(partitions=ORDERS.partitions, prefix="orders")
    publish(kafka_bootstrap, ORDERS, topic, _events())
    records, _ends = source_records(kafka_bootstrap, topic, ORDERS.partitions)
    return topic, sorted(records, key=lambda r: (r.partition, r.offset))


def _target(redis_url, kafka_bootstrap, dlq, prefix, topic, generation=1) -> FoldTarget:
    return FoldTarget(
        "customer_sessions",
        generation,
        redis_url,
        prefix,
        (("bootstrap.servers", kafka_bootstrap),),
        dlq,
        slots=SLOTS,
        key_field="customer_id",
        key_links=("order_id",),
        partition_keys=((topic, "order_id"),),
        event_time=CUSTOMER_SESSIONS_TIME,
        topics=(topic,),
    )


def _start(target: FoldTarget, topic: str) -> None:
    """What the runner does before a generation's first batch: every slot starts at 0."""
    client = redis_client(target.redis_url)
    start = {position_field(topic, p): 0 for p in range(ORDERS.partitions)}
    client.hset(target.keys.positions, mapping=start)
    for slot in range(SLOTS):
        client.hset(target.keys.slot_positions(slot), mapping=start)


def _run(target, fold, records: list[SourceRecord], chunk: int, order: list[int]) -> BatchOutcome:
    """Every slot folds every chunk (a micro-batch), slots in ``order``; then a re-run."""
    writers = {s: FoldWriter(target, fold, slot=s) for s in range(SLOTS)}
    outcome = BatchOutcome()
    for batch_id, i in enumerate(range(0, len(records), chunk)):
        for slot in order:
            writers[slot].begin_task()
            outcome.merge(writers[slot].apply(records[i : i + chunk], batch_id=batch_id))
    again = BatchOutcome()
    for slot in order:  # a re-executed batch changes nothing
        writers[slot].begin_task()
        again.merge(writers[slot].apply(records, batch_id=99))
    assert (again.applied, again.late, again.effects, sum(again.dead_letters.values())) == (
        0,
        0,
        0,
        0,
    )
    return outcome


def _oracle(topic: str, records: list[SourceRecord], fold: CustomerSessions) -> TimedResult:
    log = []
    for r in records:
        decoded = CODEC.decode(r.value)
        log.append(("orders", r.partition, r.offset, decoded.event_type, decoded.data))
    del topic
    return fold_timed(
        fold,
        CUSTOMER_SESSIONS_TIME,
        ("orders",),
        log,
        KeyResolver("customer_id", ("order_id",)),
        partitions=PARTITIONS,
    )


def _timers(client, target: FoldTarget) -> dict[str, int]:
    """Every slot's stored timers: entity -> due."""
    out: dict[str, int] = {}
    for slot in range(SLOTS):
        for member, due in client.zrange(target.keys.slot_timers(slot), 0, -1, withscores=True):
            out[member.decode()] = int(due)
    return out


def _late(kafka_bootstrap: str, dlq: str) -> list[tuple[int, int]]:
    found = []
    for message in read_to_end(kafka_bootstrap, dlq):
        headers = {k: v.decode() for k, v in message.headers() or []}
        if headers["refold.reason"] == "late":
            found.append(
                (int(headers["refold.origin.partition"]), int(headers["refold.origin.offset"]))
            )
    return sorted(found)


def test_session_timers_per_customer_fold_the_oracle_in_any_batch_size_and_on_replay(
    orders, redis_url, kafka_bootstrap, make_topic, unique
):
    topic, by_partition = orders
    probe = CustomerSessions()
    oracle = _oracle(topic, by_partition, probe)
    assert oracle.aggregate["closed"] >= 50  # timers fired...
    assert oracle.aggregate["open"] > 0  # ...and some wait for the watermark still
    assert len(oracle.late) >= 5
    # Customers whose sessions took events from more than one partition: really re-keyed.
    spread = Counter()
    for r in by_partition:
        decoded = CODEC.decode(r.value)
        if decoded.event_type == "OrderPlaced":
            spread[(decoded.data["customer_id"], r.partition)] += 1
    assert len({c for c, _p in spread}) < len(spread)
    expected_timers = {
        key: min(v[1] + probe.gap_ms for v in state["open"])
        for key, state in oracle.states.items()
        if state["open"]
    }
    expected_closed = Counter(json.dumps(e.value, sort_keys=True) for e in oracle.effects)
    client = redis_client(redis_url)
    runs = [
        (37, [0, 1, 2], sorted(by_partition, key=lambda r: (r.offset, r.partition))),
        (450, [2, 0, 1], interleaved(by_partition, random.Random(7))),
        (100_000, [1, 2, 0], by_partition),
    ]
    for run, (chunk, order, records) in enumerate(runs):
        dlq = make_topic(partitions=1, prefix="dlq")
        closed = make_topic(partitions=1, prefix="closed")
        fold = CustomerSessions(closed_topic=closed)
        prefix = f"test-{unique}-{run}"
        target = _target(redis_url, kafka_bootstrap, dlq, prefix, topic)
        GenerationRegistry.of(client, target.processor, prefix).create({}, live=True)
        _start(target, topic)
        outcome = _run(target, fold, records, chunk, order)
        assert outcome.late == len(oracle.late)
        reader = StateReader(client, target.processor, prefix)
        assert dict(reader.scan("sessions", 1)) == oracle.states, run
        assert reader.aggregate("session_totals", 1).value == dict(oracle.aggregate)
        assert _timers(client, target) == expected_timers
        assert _late(kafka_bootstrap, dlq) == sorted((int(f[7:]), o) for f, o in oracle.late)
        emitted = Counter(
            json.dumps(json.loads(m.value()), sort_keys=True)
            for m in read_to_end(kafka_bootstrap, closed)
        )
        assert emitted == expected_closed, run
        if run == 0:
            _replay(client, target, fold, by_partition, oracle, expected_timers)


def _replay(client, live: FoldTarget, fold, records, oracle, expected_timers) -> None:
    """A rebuild beside the live generation, with other batch sizes and another interleaving:
    the same states and timers; every closed session it finds the live one had emitted."""
    registry = GenerationRegistry.of(client, live.processor, live.key_prefix)
    generation = registry.create({})
    assert generation == 2
    target = _target(
        live.redis_url,
        dict(live.kafka)["bootstrap.servers"],
        live.dlq_topic,
        live.key_prefix,
        live.topics[0],
        generation,
    )
    _start(target, live.topics[0])
    outcome = _run(target, fold, interleaved(records, random.Random(3)), 211, [1, 0, 2])
    reader = StateReader(client, live.processor, live.key_prefix)
    assert dict(reader.scan("sessions", generation)) == oracle.states
    assert reader.aggregate("session_totals", generation).value == dict(oracle.aggregate)
    assert _timers(client, target) == expected_timers
    assert outcome.effects == 0
    assert outcome.suppressed == len(oracle.effects)
