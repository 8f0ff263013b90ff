"""Window processors through the envelope against real Redis and a real broker, without Spark.

The buckets equal the plain-Python oracle whatever the chunking and the interleaving of the
partitions, late records are judged per partition in log order (at the boundary and beyond), and
the closer emits each window once the watermark has passed it, then expires its buckets.
"""

from __future__ import annotations

import dataclasses
import random
import zlib
from decimal import Decimal

import pytest
import redis
from confluent_kafka import Consumer, TopicPartition

from refold.contracts.codec import EventCodec
from refold.contracts.layout import position_field
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.windows import result_from_record
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import fold_windows
from refold.processors.fold.records import SourceRecord
from refold.processors.fold.windows import Measure, decode_timer
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from refold.processors.runtime.window_store import WindowCloser
from refold.processors.sales_windows.config import SALES_WINDOWS
from refold.processors.sales_windows.projection import SalesWindows
from refold.services.reader.window_reader import WindowReader
from tests.support.topics import interleaved, random_chunks
from tests.support.windows import bucket_dump

FOLD = SalesWindows()
EVENT_TIME = SALES_WINDOWS.event_time
CODEC = EventCodec()


def _result(value: bytes) -> dict:
    """A closed window's result as emitted (a WindowResult record), in result_of's shape."""
    return result_from_record(EventCodec().decode(value).data)


def _records(events, partitions=4, topic="orders"):
    offsets = [0] * partitions
    out = []
    for event_type, event in events:
        partition = zlib.crc32(event["order_id"].encode()) % partitions
        value = CODEC.encode(event_type, event)
        out.append(
            SourceRecord(topic, partition, offsets[partition], event["order_id"].encode(), value)
        )
        offsets[partition] += 1
    return out


def _oracle_input(records):
    for record in records:
        decoded = CODEC.decode(record.value)
        yield (
            position_field(record.topic, record.partition),
            record.offset,
            decoded.event_type,
            decoded.data,
        )


def _windows_target(target: FoldTarget, generation: int = 1, **event_time) -> FoldTarget:
    chosen = dataclasses.replace(EVENT_TIME, **event_time) if event_time else EVENT_TIME
    return dataclasses.replace(
        target, processor="sales_windows", generation=generation, event_time=chosen
    )


def _buckets(client: redis.Redis, target: FoldTarget) -> dict:
    return bucket_dump(client, target.keys)


def _chunked(records, rng):
    """The records in random chunks, each partition's in log order, partitions interleaved."""
    return random_chunks(interleaved(records, rng), rng, 400)


def _paid(order_id: str, at_ms: int, amount: int = 1000, currency: str = "EUR"):
    return (
        "OrderPaid",
        {
            "event_id": f"e-{order_id}-{at_ms}",
            "order_id": order_id,
            "amount_minor": amount,
            "currency": currency,
            "payment_method": "CARD",
            "paid_at": at_ms,
        },
    )


def _consume(bootstrap: str, topic: str, partitions: int = 1, polls: int = 20):
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "t", "enable.auto.commit": "false"}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    found = []
    for _ in range(polls):
        batch = [m for m in consumer.consume(500, timeout=0.5) if m.error() is None]
        found += batch
        if not batch and found:
            break
    consumer.close()
    return found


def test_buckets_equal_the_oracle_whatever_the_chunks_and_interleaving(target, redis_url):
    events = list(OrderSimulator(600, seed=31, anomaly_rate=0))
    records = _records(events)
    oracle = fold_windows(FOLD, EVENT_TIME, _oracle_input(records))
    client = redis_client(redis_url)
    dumps = []
    for generation, seed in ((1, None), (2, 1), (3, 2)):
        chosen = _windows_target(target, generation)
        writer = FoldWriter(chosen, FOLD)
        if seed is None:
            writer.apply(records, batch_id=0)
        else:
            for batch_id, chunk in enumerate(_chunked(records, random.Random(seed))):
                writer.apply(chunk, batch_id=batch_id)
        writer.apply(records, batch_id=99)  # a replayed batch changes nothing
        dumps.append(_buckets(client, chosen))
    assert dumps[0] == oracle.buckets
    assert dumps[1] == dumps[0]
    assert dumps[2] == dumps[0]
    assert {g for (_w, _s, g) in oracle.buckets} >= {"EUR", "USD"}


@pytest.mark.parametrize("policy", ["dead-letter", "side-output", "accept"])
def test_late_records_at_the_boundary_and_beyond(
    target, redis_url, kafka_bootstrap, make_topic, policy
):
    late_topic = make_topic(partitions=1, prefix="late")
    chosen = _windows_target(target, late=policy, lateness_ms=30_000, late_topic=late_topic)
    base = 1_700_000_040_000 + 40_000  # a minute boundary + 40 s
    events = [
        _paid("a", base),  # clock = base
        _paid("b", base - 30_000),  # exactly at the watermark: on time
        _paid("c", base - 30_001),  # one ms beyond: late
        _paid("d", base + 60_000),  # clock moves on
        _paid("e", base),  # 60 s behind: late
    ]
    records = [
        SourceRecord("orders", 0, i, e["order_id"].encode(), CODEC.encode(t, e))
        for i, (t, e) in enumerate(events)
    ]
    writer = FoldWriter(chosen, FOLD)
    # One record per transaction, then all at once elsewhere: the same verdicts.
    outcomes = [writer.apply([r], batch_id=i) for i, r in enumerate(records)]
    assert sum(o.late for o in outcomes) == 2
    client = redis_client(redis_url)
    minute = base - base % 60_000
    buckets = _buckets(client, chosen)
    per_minute = {s: b["count"] for (w, s, g), b in buckets.items() if w == "per_minute"}
    if policy == "accept":
        assert per_minute == {minute: 4, minute + 60_000: 1}
    else:
        assert per_minute == {minute: 2, minute + 60_000: 1}
    oracle = fold_windows(
        FOLD,
        chosen.event_time,
        (("orders/0", i, t, e) for i, (t, e) in enumerate(events)),
    )
    assert buckets == oracle.buckets
    assert oracle.late == [("orders/0", 2), ("orders/0", 4)]
    if policy == "accept":
        return
    topic = late_topic if policy == "side-output" else target.dlq_topic
    letters = _consume(kafka_bootstrap, topic)
    assert [int(dict(m.headers())["refold.origin.offset"]) for m in letters] == [2, 4]
    assert {dict(m.headers())["refold.reason"] for m in letters} == {b"late"}


def test_the_closer_emits_each_passed_window_once_then_expires_it(
    target, redis_url, kafka_bootstrap, make_topic
):
    events = list(OrderSimulator(300, seed=8, anomaly_rate=0))
    records = _records(events, partitions=2)
    chosen = _windows_target(target, retention_ms=120_000)
    results_topic = make_topic(partitions=1, prefix="windows")
    writer = FoldWriter(chosen, FOLD)
    writer.apply(records, batch_id=0)
    client = redis_client(redis_url)
    # One generation of a registered processor: the closer reads its status.
    registry = GenerationRegistry.of(client, "sales_windows", chosen.key_prefix)
    assert registry.create({"topics": ["orders"]}, live=True) == 1
    kafka = {"bootstrap.servers": kafka_bootstrap}
    closer = WindowCloser(
        chosen.layout, 1, FOLD, EVENT_TIME.lateness_ms, redis_url, kafka, results_topic
    )
    watermark = closer.watermark()
    oracle = fold_windows(FOLD, EVENT_TIME, _oracle_input(records))
    assert watermark == min(oracle.clocks.values()) - EVENT_TIME.lateness_ms
    emitted = closer.close()
    assert emitted > 0
    assert closer.close() == 0  # nothing twice
    results = [_result(m.value()) for m in _consume(kafka_bootstrap, results_topic)]
    assert len(results) == emitted
    assert all(r["end"] <= watermark for r in results)
    windows = {w.name: w for w in FOLD.windows}
    for result in results:
        expected = oracle.window(windows[result["window"]], result["end"], result["group"])
        assert result == expected
    # Retention: every bucket whose last window ended 2 minutes before the watermark is gone.
    left = _buckets(client, chosen)
    for name, start, _group in left:
        assert windows[name].ends(start)[-1] + 120_000 > watermark


def test_a_record_folded_while_its_window_closes_keeps_the_timer_for_a_correction(
    target, redis_url, kafka_bootstrap, make_topic
):
    results_topic = make_topic(partitions=1, prefix="windows")
    chosen = _windows_target(target, late="accept", lateness_ms=0)
    base = 1_700_000_040_000  # a minute boundary
    events = [_paid("a", base + 1_000, 100), _paid("b", base + 61_000, 100)]
    records = [
        SourceRecord("orders", 0, i, e["order_id"].encode(), CODEC.encode(t, e))
        for i, (t, e) in enumerate(events)
    ]
    writer = FoldWriter(chosen, FOLD)
    writer.apply(records)
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, "sales_windows", chosen.key_prefix)
    registry.create({"topics": ["orders"]}, live=True)
    closer = WindowCloser(
        chosen.layout, 1, FOLD, 0, redis_url, {"bootstrap.servers": kafka_bootstrap}, results_topic
    )
    timers = chosen.keys.timers("close")
    member = b'["per_minute",' + str(base + 60_000).encode() + b',"EUR"]'
    assert client.zscore(timers, member) is not None
    due = [("per_minute", base + 60_000, "EUR")]
    _buckets_read, _distinct, read = closer._read(due)
    # A late payment (accepted) lands in the minute between the read and the settle.
    late = _paid("c", base + 2_000, 50)
    writer.apply([SourceRecord("orders", 0, 2, b"c", CODEC.encode(*late))])
    closer._settle([member], due, read)
    assert client.zscore(timers, member) is not None  # kept: it fires again, corrected
    closer.close()
    emitted = [_result(m.value()) for m in _consume(kafka_bootstrap, results_topic)]
    minute = [r for r in emitted if r["window"] == "per_minute" and r["end"] == base + 60_000]
    assert minute[-1]["count"] == 2
    assert minute[-1]["sum:amount_minor"] == 150
    assert client.zscore(timers, member) is None


def test_a_rebuild_emits_what_a_live_generation_that_died_never_closed_and_nothing_else(
    target, redis_url, kafka_bootstrap, make_topic
):
    # The live processor closes a minute, folds the next ones and dies before closing them;
    # a replay then rebuilds (nobody starts the live one again). The rebuild must emit the
    # minutes the live generation still held, and not the one it emitted.
    client = redis_client(redis_url)
    kafka = {"bootstrap.servers": kafka_bootstrap}
    live, rebuild = (_windows_target(target, g, lateness_ms=0) for g in (1, 2))
    registry = GenerationRegistry.of(client, "sales_windows", live.key_prefix)
    assert registry.create({"topics": ["orders"]}, live=True) == 1
    base = 1_700_000_040_000  # a minute boundary
    first = [_paid("a", base + 1_000), _paid("b", base + 61_000)]
    then = [_paid("c", base + 121_000)]
    offsets = iter(range(10))
    records = [
        SourceRecord("orders", 0, next(offsets), e["order_id"].encode(), CODEC.encode(t, e))
        for t, e in [*first, *then]
    ]
    FoldWriter(live, FOLD).apply(records[:2])
    live_topic, rebuild_topic = (make_topic(partitions=1, prefix="windows") for _ in range(2))
    live_closer = WindowCloser(live.layout, 1, FOLD, 0, redis_url, kafka, live_topic)
    assert live_closer.close() > 0  # the first minute, and the hopping windows ending there
    emitted_live = {
        (r["window"], r["end"], r["group"])
        for r in (_result(m.value()) for m in _consume(kafka_bootstrap, live_topic))
    }
    assert ("per_minute", base + 60_000, "EUR") in emitted_live
    FoldWriter(live, FOLD).apply(records[2:])  # the second minute passes: then the crash
    held = {
        (name, end, group)
        for name, end, group in map(decode_timer, client.zrange(live.keys.timers("close"), 0, -1))
        if end <= base + 121_000
    }
    assert ("per_minute", base + 120_000, "EUR") in held

    assert registry.create({"topics": ["orders"], "replay_of": 1}) == 2
    FoldWriter(rebuild, FOLD).apply(records)
    rebuild_closer = WindowCloser(rebuild.layout, 2, FOLD, 0, redis_url, kafka, rebuild_topic)
    rebuild_closer.close()
    emitted_rebuild = {
        (r["window"], r["end"], r["group"])
        for r in (_result(m.value()) for m in _consume(kafka_bootstrap, rebuild_topic))
    }
    assert emitted_rebuild == held
    assert emitted_rebuild.isdisjoint(emitted_live)


class _DecimalSales(SalesWindows):
    """sales_windows with decimal measures: the amount in major units, and in another currency."""

    scales = {"amount": 2, "amount_chf": 4}  # noqa: RUF012 - a fold's declaration

    def measure(self, event_type, event):
        if event["currency"] == "ZZZ":  # a fold bug a user can make: the value is not a number
            return [Measure(group="ZZZ", values={"amount": "n/a"})]
        (paid,) = super().measure(event_type, event)
        major = event["amount_minor"] / 100  # a float, e.g. 12.34
        values = {**paid.values, "amount": major, "amount_chf": major * 0.93717}
        return [dataclasses.replace(paid, values=values)]


def test_decimal_measures_are_exact_in_any_order_and_reported_in_the_user_s_units(
    target, redis_url, kafka_bootstrap, make_topic
):
    fold = _DecimalSales()
    events = list(OrderSimulator(400, seed=5, anomaly_rate=0))
    last_paid = max(e["paid_at"] for t, e in events if t == "OrderPaid")
    events.append(_paid("bad", last_paid, 1, "ZZZ"))  # on time
    records = _records(events)
    chosen = _windows_target(target, retention_ms=3_600_000)
    client = redis_client(redis_url)
    oracle = fold_windows(fold, EVENT_TIME, _oracle_input(records))
    dumps = []
    for generation, seed in ((1, None), (2, 3)):
        writer = FoldWriter(dataclasses.replace(chosen, generation=generation), fold)
        if seed is None:
            outcome = writer.apply(records, batch_id=0)
            assert outcome.rejected == 1
        else:
            for batch_id, chunk in enumerate(_chunked(records, random.Random(seed))):
                writer.apply(chunk, batch_id=batch_id)
        dumps.append(_buckets(client, dataclasses.replace(chosen, generation=generation)))
    assert dumps[0] == dumps[1] == oracle.buckets
    # The plain-Python sum, in Decimal, of every on-time paid amount per currency and minute.
    expected: dict[tuple[int, str], Decimal] = {}
    for event_type, event in events:
        if event_type == "OrderPaid" and event["currency"] != "ZZZ":
            minute = event["paid_at"] - event["paid_at"] % 60_000
            key = (minute, event["currency"])
            expected[key] = expected.get(key, Decimal(0)) + Decimal(event["amount_minor"]) / 100
    registry = GenerationRegistry.of(client, "sales_windows", chosen.key_prefix)
    assert registry.create({"topics": ["orders"]}, live=True) == 1
    reader = WindowReader.from_fold(client, fold, chosen.key_prefix)
    per_minute = next(w for w in fold.windows if w.name == "per_minute")
    for (minute, currency), amount in expected.items():
        read = reader.window("per_minute", currency, minute + 60_000).value
        assert read["sum:amount"] == amount
        assert isinstance(read["sum:amount"], Decimal)
        assert read == oracle.window(per_minute, minute + 60_000, currency)
    # The closer emits the same results, scales included, decoded back to decimals.
    results_topic = make_topic(partitions=1, prefix="windows")
    kafka = {"bootstrap.servers": kafka_bootstrap}
    closer = WindowCloser(chosen.layout, 1, fold, 0, redis_url, kafka, results_topic)
    assert closer.close() > 0
    windows = {w.name: w for w in fold.windows}
    for message in _consume(kafka_bootstrap, results_topic):
        assert EventCodec().decode(message.value()).data["scales"] == fold.scales
        result = _result(message.value())
        assert result == oracle.window(windows[result["window"]], result["end"], result["group"])
    letters = _consume(kafka_bootstrap, chosen.dlq_topic)
    assert len(letters) == 1  # once over every generation: g2 skips what g1 sent (dl:sent)
    headers = dict(letters[0].headers())
    assert headers["refold.reason"] == b"rejected"
    assert b"measure 'amount' is 'n/a', not a number" in headers["refold.error"]


def test_after_a_flip_the_new_generation_emits_only_the_windows_the_old_one_did_not(
    target, redis_url, kafka_bootstrap, make_topic
):
    # A replay's flip: g1 emitted the windows its watermark passed after the first half of the
    # log, then folded the rest without closing again (the flip came first); g2, the rebuild,
    # folded it all. g2's closer emits what g1 still held and what neither closed, and never
    # again what g1 emitted. A generation closed alone (g3, into its own topic) is the reference.
    events = list(OrderSimulator(400, seed=21, anomaly_rate=0))
    records = _records(events, partitions=2)
    kafka = {"bootstrap.servers": kafka_bootstrap}
    results_topic, reference_topic = (make_topic(partitions=1, prefix=p) for p in ("win", "ref"))
    client = redis_client(redis_url)
    first, second, third = (_windows_target(target, g) for g in (1, 2, 3))
    registry = GenerationRegistry.of(client, "sales_windows", first.key_prefix)
    assert registry.create({"topics": ["orders"]}, live=True) == 1

    def closer(generation: int, topic: str) -> WindowCloser:
        layout = first.layout
        return WindowCloser(
            layout, generation, FOLD, EVENT_TIME.lateness_ms, redis_url, kafka, topic
        )

    half = len(records) // 2
    FoldWriter(first, FOLD).apply(records[:half], batch_id=0)
    by_first = closer(1, results_topic).close()
    FoldWriter(first, FOLD).apply(records[half:], batch_id=1)
    assert registry.create({"topics": ["orders"], "replay_of": 1}) == 2
    FoldWriter(second, FOLD).apply(records, batch_id=0)
    registry.flip(2)
    after_flip = closer(2, results_topic)
    by_second = after_flip.close()
    assert registry.create({"topics": ["orders"]}) == 3
    FoldWriter(third, FOLD).apply(records, batch_id=0)
    registry.flip(3, record_replaced=False)
    by_reference = closer(3, reference_topic).close()

    def emitted(topic: str) -> list[tuple[str, int, str]]:
        results = [_result(m.value()) for m in _consume(kafka_bootstrap, topic)]
        return [(r["window"], r["end"], r["group"]) for r in results]

    both, reference = emitted(results_topic), emitted(reference_topic)
    assert by_first > 0  # the premise: each closed some
    assert by_second > 0
    assert after_flip.suppressed == by_first  # what g1 emitted, g2 did not emit again
    assert len(both) == len(set(both)) == by_first + by_second  # no window twice
    assert len(reference) == by_reference
    assert set(both) == set(reference)  # none missing
