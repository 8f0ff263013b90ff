"""Re-keyed event-time processors on real Redis and a real broker, without Spark.

Per-customer hourly spend over ``OrderPaid`` (which carries no ``customer_id``: its order's
``OrderPlaced`` links it) on orders partitioned by ``order_id``, with late payments: three
writer slots fold the log in three different batch sizes and slot orders. Each run has the same
buckets as the plain-Python oracle, dead-letters the same records with reason ``late`` (and
``key-missing``), ends with the same per-partition clocks and watermark, and its closer emits
the oracle's windows. A re-keyed entity fold (customer_stats with an event time) agrees with
``fold_timed`` in two batch sizes too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from refold.contracts.codec import EventCodec
from refold.contracts.commerce import ORDERS
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.layout import position_field
from refold.contracts.processors import EventTime
from refold.contracts.settings import KafkaSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.windows import result_from_record, watermark_of
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.customer_stats.projection import CustomerStatsProjection
from refold.processors.fold.oracle import fold_timed, fold_windows
from refold.processors.fold.records import SourceRecord
from refold.processors.fold.rekey import KeyResolver
from refold.processors.fold.windows import Measure, Tumbling
from refold.processors.runtime.envelope import BatchOutcome, FoldTarget, FoldWriter
from refold.processors.runtime.kafka_ranges import SourceOptions, read_messages
from refold.processors.runtime.window_store import WindowCloser, generation_watermark
from refold.services.producer.publisher import EventPublisher
from refold.services.reader.state_reader import StateReader
from tests.support.topics import publish, source_records
from tests.support.windows import bucket_dump

SLOTS = 3
HOUR = 3_600_000
EVENT_TIME = EventTime(field="paid_at", lateness_ms=10 * 60_000, retention_ms=48 * HOUR)
CODEC = EventCodec()


class HourlySpend:
    """Spend per customer per hour: the group is the customer the order's link gives."""

    name = "hourly_spend"
    event_types = ("OrderPaid",)
    windows = (Tumbling("hourly", size_ms=HOUR),)
    distinct = ("payment_methods",)

    def measure(self, event_type: str, event: Mapping[str, Any]) -> Iterable[Measure]:
        del event_type
        return [
            Measure(
                group=str(event["customer_id"]),
                values={"amount_minor": int(event["amount_minor"])},
                distinct={"payment_methods": str(event["payment_method"])},
            )
        ]


FOLD = HourlySpend()


def _events() -> list[tuple[str, dict]]:
    """Simulated orders over ~8 hours of payments; every 25th payment 90 minutes behind (late
    where its partition has moved on), and two payments of orders never placed (no customer)."""
    events = list(OrderSimulator(900, seed=23, anomaly_rate=0))
    base = min(e["paid_at"] for t, e in events if t == "OrderPaid")
    out = []
    paid = 0
    for event_type, event in events:
        if event_type == "OrderPaid":
            at = base + (event["paid_at"] - base) * 40  # ticks of ~8 s: hours of payments
            paid += 1
            if paid % 25 == 0:
                at -= 90 * 60_000
            event = {**event, "paid_at": at}
        out.append((event_type, event))
    orphan = dict(next(e for t, e in out if t == "OrderPaid"))
    for n in range(2):
        out.append(("OrderPaid", {**orphan, "event_id": f"orphan-{n}", "order_id": f"ord-x{n}"}))
    return out


@pytest.fixture
def orders(kafka_bootstrap, make_topic):
    """The orders topic (8 partitions by order_id) and its records as read back."""
    topic = make_topic(partitions=ORDERS.partitions, prefix="orders")
    publish(kafka_bootstrap, ORDERS, topic, _events())
    records, _ends = source_records(kafka_bootstrap, topic, ORDERS.partitions)
    return topic, sorted(records, key=lambda r: (r.offset, r.partition))  # partitions interleaved
    return topic, sorted(records, key=lambda r: (r.offset, r.partition))


def _target(redis_url, kafka_bootstrap, dlq, prefix, topic) -> FoldTarget:
    return FoldTarget(
        "hourly_spend",
        1,
        redis_url,
        prefix,
        (("bootstrap.servers", kafka_bootstrap),),
        dlq,
        slots=SLOTS,
        key_field="customer_id",
        key_links=("order_id",),
        partition_keys=((topic, "order_id"),),
        event_time=EVENT_TIME,
        topics=(topic,),
    )


def _start(target: FoldTarget, topic: str) -> None:
    """What the runner does before a generation's first batch: every slot starts at 0."""
    client = redis_client(target.redis_url)
    start = {position_field(topic, p): 0 for p in range(ORDERS.partitions)}
    client.hset(target.keys.positions, mapping=start)
    for slot in range(SLOTS):
        client.hset(target.keys.slot_positions(slot), mapping=start)


def _run(target: FoldTarget, records: list[SourceRecord], chunk: int, order: list[int]):
    """Every slot folds every chunk (a micro-batch), slots in ``order``; then a re-run."""
    writers = {s: FoldWriter(target, FOLD, slot=s) for s in range(SLOTS)}
    outcome = BatchOutcome()
    for batch_id, i in enumerate(range(0, len(records), chunk)):
        for slot in order:
            writers[slot].begin_task()
            outcome.merge(writers[slot].apply(records[i : i + chunk], batch_id=batch_id))
    again = BatchOutcome()
    for slot in order:  # a re-executed batch changes nothing
        writers[slot].begin_task()
        again.merge(writers[slot].apply(records, batch_id=99))
    assert (again.applied, again.late, sum(again.dead_letters.values())) == (0, 0, 0)
    return outcome


def _letters(bootstrap: str, topic: str) -> list[tuple[str, str, int]]:
    """The dead-letter topic as read_committed sees it: (reason, origin partition, offset)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "t", "enable.auto.commit": "false"}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    found = []
    for _ in range(40):
        batch = [m for m in consumer.consume(500, timeout=0.5) if m.error() is None]
        found += batch
        if not batch and found:
            break
    consumer.close()
    out = []
    for message in found:
        headers = {k: v.decode() for k, v in message.headers() or []}
        field = position_field(headers["refold.origin.topic"], headers["refold.origin.partition"])
        out.append((headers["refold.reason"], field, int(headers["refold.origin.offset"])))
    return sorted(out)


def test_three_batch_sizes_fold_the_oracle_with_the_same_late_letters(
    orders, redis_url, kafka_bootstrap, make_topic, unique
):
    topic, records = orders
    oracle_input = []
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        decoded = CODEC.decode(r.value)
        oracle_input.append(
            (position_field(r.topic, r.partition), r.offset, decoded.event_type, decoded.data)
        )
    oracle = fold_windows(FOLD, EVENT_TIME, oracle_input, KeyResolver("customer_id", ("order_id",)))
    assert len(oracle.late) >= 10
    assert len(oracle.key_missing) == 2
    assert len({s for _w, s, _g in oracle.buckets}) >= 5  # hours of windows
    expected_letters = sorted(
        [("late", f, o) for f, o in oracle.late]
        + [("key-missing", f, o) for f, o in oracle.key_missing]
    )
    client = redis_client(redis_url)
    dumps = []
    for run, (chunk, order) in enumerate([(37, [0, 1, 2]), (450, [2, 0, 1]), (100_000, [1, 2, 0])]):
        dlq = make_topic(partitions=1, prefix="dlq")
        target = _target(redis_url, kafka_bootstrap, dlq, f"test-{unique}-{run}", topic)
        _start(target, topic)
        outcome = _run(target, records, chunk, order)
        assert outcome.late == len(oracle.late)
        assert outcome.dead_letters == {"late": len(oracle.late), "key-missing": 2}
        assert _letters(kafka_bootstrap, dlq) == expected_letters
        dumps.append(bucket_dump(client, target.keys))
        # The generation's clocks are the slots' minimum: the partitions' clocks of the oracle.
        raw = client.hgetall(target.keys.clocks)
        clocks = {k.decode(): int(v) for k, v in raw.items() if b"|" not in k}
        assert clocks == oracle.clocks
        for slot in range(SLOTS):
            mine = {
                k.decode().partition("|")[2]: int(v)
                for k, v in raw.items()
                if k.startswith(f"s{slot}|".encode())
            }
            assert mine == oracle.clocks
        watermark = generation_watermark(client, target.keys, EVENT_TIME.lateness_ms)
        assert watermark == watermark_of(oracle.clocks, EVENT_TIME.lateness_ms)
        _check_closer(client, target, kafka_bootstrap, make_topic, oracle, watermark)
    assert dumps[0] == oracle.buckets
    assert dumps[1] == dumps[0]
    assert dumps[2] == dumps[0]


def _check_closer(client, target, kafka_bootstrap, make_topic, oracle, watermark):
    """The closer emits every hour the watermark has passed, each equal to the oracle's."""
    results_topic = make_topic(partitions=1, prefix="windows")
    registry = GenerationRegistry.of(client, "hourly_spend", target.key_prefix)
    assert registry.create({"topics": list(target.topics)}, live=True) == 1
    closer = WindowCloser(
        target.layout,
        1,
        FOLD,
        EVENT_TIME.lateness_ms,
        target.redis_url,
        {"bootstrap.servers": kafka_bootstrap},
        results_topic,
    )
    emitted = closer.close()
    passed = {(s, g) for (_w, s, g) in oracle.buckets if s + HOUR <= watermark}
    assert emitted == len(passed) > 0
    consumer = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": "t", "enable.auto.commit": "false"}
    )
    consumer.assign([TopicPartition(results_topic, 0, 0)])
    found = []
    for _ in range(30):
        found += [m for m in consumer.consume(500, timeout=1) if m.error() is None]
        if len(found) >= emitted:
            break
    consumer.close()
    assert len(found) == emitted
    window = FOLD.windows[0]
    for message in found:
        result = result_from_record(CODEC.decode(message.value()).data)
        assert result == oracle.window(window, result["end"], result["group"])


_TIME_FIELDS = {
    "OrderPlaced": "placed_at",
    "OrderLineAdded": "added_at",
    "OrderLineRemoved": "removed_at",
    "OrderPaid": "paid_at",
    "OrderShipped": "shipped_at",
    "OrderCancelled": "cancelled_at",
}


def test_a_re_keyed_entity_fold_judges_lateness_per_partition_as_its_oracle(
    redis_url, kafka_bootstrap, make_topic, unique
):
    """customer_stats (entities per customer over orders keyed by order_id) with an event time
    and every 20th event 5 s behind: two batch sizes give the oracle's states and late letters."""
    topic = make_topic(partitions=ORDERS.partitions, prefix="orders")
    events = []
    for n, (event_type, event) in enumerate(OrderSimulator(400, seed=5, anomaly_rate=0)):
        time_field = _TIME_FIELDS[event_type]
        shift = 5_000 if n % 20 == 19 else 0
        events.append((event_type, {**event, time_field: event[time_field] - shift}))
    publisher = EventPublisher(
        KafkaSettings(bootstrap_servers=kafka_bootstrap),
        topics=[dataclasses.replace(ORDERS, name=topic)],
    )
    publisher.emit_many(events)
    publisher.close()
    options = SourceOptions(kafka=(("bootstrap.servers", kafka_bootstrap),), topics=(topic,))
    with LogOffsets({"bootstrap.servers": kafka_bootstrap}) as offsets:
        ends = offsets.end_offsets([(topic, p) for p in range(ORDERS.partitions)])
    ranges = tuple((topic, p, 0, ends[(topic, p)]) for p in range(ORDERS.partitions))
    records = [
        SourceRecord.of_message(m) for chunk in read_messages(options, ranges, "t") for m in chunk
    ]
    records.sort(key=lambda r: (r.offset, r.partition))
    event_time = EventTime(
        field="paid_at", lateness_ms=2_000, by_type=tuple(sorted(_TIME_FIELDS.items()))
    )
    fold = CustomerStatsProjection()
    timed = []
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        decoded = CODEC.decode(r.value)
        timed.append((r.topic, r.partition, r.offset, decoded.event_type, decoded.data))
    oracle = fold_timed(
        fold, event_time, (topic,), timed, KeyResolver("customer_id", ("order_id",))
    )
    assert len(oracle.late) >= 10
    client = redis_client(redis_url)
    for run, chunk in enumerate((29, 5_000)):
        dlq = make_topic(partitions=1, prefix="dlq")
        target = dataclasses.replace(
            _target(redis_url, kafka_bootstrap, dlq, f"test-{unique}-e{run}", topic),
            processor="customer_stats",
            event_time=event_time,
        )
        _start(target, topic)
        writers = [FoldWriter(target, fold, slot=s) for s in range(SLOTS)]
        for i in range(0, len(records), chunk):
            for writer in writers:
                writer.begin_task()
                writer.apply(records[i : i + chunk])
        reader = StateReader.from_url(redis_url, "customer_stats", target.key_prefix)
        assert dict(reader.scan("customers", generation=1)) == oracle.states
        late = [(r, f, o) for r, f, o in _letters(kafka_bootstrap, dlq) if r == "late"]
        assert late == sorted(("late", f, o) for f, o in oracle.late)
        raw = client.hgetall(target.keys.clocks)
        assert {k.decode(): int(v) for k, v in raw.items() if b"|" not in k} == oracle.clocks
