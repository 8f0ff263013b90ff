"""A two-stage event-time chain through the envelope, against real Redis and a real broker.

order_state folds orders and writes its status changes to an output stream with watermark
markers (the stream's ``TopicSpec.event_time_field``), as parallel tasks do: each source
partition's batches in its own writer and Kafka transactions, the partitions in a random order
at every round. customer_alerts folds that stream with event time per upstream stream
(docs/event-time.md, "Across chains"). Its alerts fire, its states, insights and clocks equal
the oracle (``fold_timed`` over the same log, markers included), live and on a replay with
other chunks and another interleaving of the derived partitions; judged per raw partition at
the same lateness, the same log would have late records. With an idle timeout, a source
partition that goes quiet does not hold the watermark back, deterministically on replay.
"""

from __future__ import annotations

import dataclasses
import random
import zlib
from collections.abc import Iterator
from typing import Any

from refold.contracts.codec import EventCodec
from refold.contracts.processors import EventTime
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.watermarks import WATERMARK, read_marker
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.customer_alerts.config import CUSTOMER_ALERTS
from refold.processors.customer_alerts.projection import build as build_customer_alerts
from refold.processors.fold.oracle import TimedResult, fold_timed
from refold.processors.fold.patterns import PatternOptions
from refold.processors.fold.records import SourceRecord
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from refold.processors.runtime.kafka_ranges import read_log
from refold.services.reader.state_reader import StateReader
from tests.support.topics import interleaved, random_chunks, read_to_end

CODEC = EventCodec()
SOURCES = 4  # order partitions: order_state's streams
DERIVED = 3  # partitions of its output stream
HOUR = 3_600_000
# customer_alerts' own: it covers a stream's own disorder, not the upstream's batch span.
EVENT_TIME = CUSTOMER_ALERTS.event_time
DAY = 24 * HOUR
IDLE_MS = 15 * 60_000  # more than the streams' spread on a derived partition (rounds' spans)


def _insights(bootstrap: str, topic: str) -> dict[str, dict]:
    """The insights on ``topic`` by id (at least once: a copy is the same insight)."""
    seen: dict[str, dict] = {}
    for message in read_to_end(bootstrap, topic):
        insight = CODEC.decode(message.value()).data
        assert seen.setdefault(insight["insight_id"], insight) == insight
    return seen


def _orders(events, topic: str) -> list[SourceRecord]:
    offsets = [0] * SOURCES
    out = []
    for event_type, event in events:
        partition = zlib.crc32(event["order_id"].encode()) % SOURCES
        value = CODEC.encode(event_type, event)
        key = event["order_id"].encode()
        out.append(SourceRecord(topic, partition, offsets[partition], key, value))
        offsets[partition] += 1
    return out


def _final_orders(at: int) -> list[tuple[str, dict[str, Any]]]:
    """One order placed on every source partition at ``at``: every stream moves past the end."""
    out: list[tuple[str, dict[str, Any]]] = []
    n = 0
    while len(out) < SOURCES:
        order_id = f"ord-z{n}"
        n += 1
        partition = zlib.crc32(order_id.encode()) % SOURCES
        if any(zlib.crc32(e["order_id"].encode()) % SOURCES == partition for _t, e in out):
            continue
        line = {"sku": "sku-z", "qty": 1, "unit_price_minor": 100}
        event = {
            "event_id": f"evt-z{n}",
            "order_id": order_id,
            "customer_id": f"cus-z{n}",
            "currency": "EUR",
            "lines": [line],
            "placed_at": at,
        }
        out.append(("OrderPlaced", event))
    return out


def _upstream(target: FoldTarget, projection, records: list[SourceRecord], seed: int) -> None:
    """order_state as parallel tasks: a writer per source partition, partitions in random order
    at every round, so the derived partitions interleave the streams by up to a round's span."""
    rng = random.Random(seed)
    queues: dict[int, list[SourceRecord]] = {}
    for record in records:
        queues.setdefault(record.partition, []).append(record)
    writers = {p: FoldWriter(target, projection) for p in queues}
    batch = 0
    while any(queues.values()):
        order = list(queues)
        rng.shuffle(order)
        for partition in order:
            size = rng.randint(20, 250)
            chunk, queues[partition] = queues[partition][:size], queues[partition][size:]
            if chunk:
                writers[partition].apply(chunk, batch_id=batch)
        batch += 1


def _oracle_input(log: list[SourceRecord]) -> Iterator[tuple[str, int, int, str, Any]]:
    for record in log:
        marker = read_marker(record.headers)
        if marker is not None:
            yield (
                record.topic,
                record.partition,
                record.offset,
                WATERMARK,
                {"at": marker.at, "of": marker.of},
            )
            continue
        decoded = CODEC.decode(record.value)
        yield record.topic, record.partition, record.offset, decoded.event_type, decoded.data


def _downstream(target: FoldTarget, projection, log: list[SourceRecord], seed: int | None):
    writer = FoldWriter(target, projection)
    if seed is None:
        writer.apply(log, batch_id=0)
        return
    rng = random.Random(seed)
    records = interleaved(log, rng)
    chunks = random_chunks(records, rng, 300)
    for batch, chunk in enumerate(chunks):
        writer.apply(chunk, batch_id=batch)
    outcome = writer.apply(records, batch_id=len(chunks))  # a replayed batch changes nothing
    assert (outcome.applied, outcome.effects) == (0, 0)


def _chain(base: FoldTarget, make_topic, orders_events, seed: int):
    """Run order_state over the orders; the derived log (changes and markers) as read back."""
    orders = make_topic(partitions=SOURCES, prefix="orders")
    changes = make_topic(partitions=DERIVED, prefix="changes")
    notices = make_topic(partitions=1, prefix="notices")
    upstream = dataclasses.replace(
        base,
        topics=(orders,),
        marked=((changes, "changed_at"),),
        streams=SOURCES,
    )
    projection = OrderStateProjection(notifications_topic=notices, changes_topic=changes)
    _upstream(upstream, projection, _orders(orders_events, orders), seed)
    kafka = dict(base.kafka)
    log = [SourceRecord.of_message(m) for chunk in read_log(kafka, changes) for m in chunk]
    return changes, log


def _alerts_target(base: FoldTarget, changes: str, generation: int, event_time: EventTime):
    return dataclasses.replace(
        base,
        processor="customer_alerts",
        generation=generation,
        event_time=event_time,
        topics=(changes,),
        stream_topics=(changes,),
        check_keys=True,
    )


def _oracle(changes: str, log: list[SourceRecord], event_time: EventTime, streams: bool):
    return fold_timed(
        build_customer_alerts(PatternOptions()),
        event_time,
        (changes,),
        _oracle_input(log),
        stream_topics=(changes,) if streams else (),
        origins={r[:3]: str(r.origin) for r in log if r.origin is not None},
    )


def _check_generations(
    base: FoldTarget,
    redis_url: str,
    kafka_bootstrap: str,
    make_topic,
    changes: str,
    log: list[SourceRecord],
    event_time: EventTime,
    oracle: TimedResult,
) -> None:
    """Live and a replay, with other chunks and interleaving: both == the oracle."""
    want = {e.value["insight_id"]: e.value for e in oracle.effects}
    client = redis_client(redis_url)
    reader = StateReader(client, "customer_alerts", base.key_prefix)
    for generation, seed in ((1, None), (2, 3), (3, 8)):
        insights = make_topic(partitions=2, prefix="insights")
        projection = build_customer_alerts(PatternOptions(insights_topic=insights))
        target = _alerts_target(base, changes, generation, event_time)
        _downstream(target, projection, log, seed)
        assert dict(reader.scan("patterns", generation)) == oracle.states, generation
        totals = reader.aggregate("insight_counts", generation).value
        assert totals == dict(oracle.aggregate), generation
        assert _insights(kafka_bootstrap, insights) == want, generation
        registry = GenerationRegistry.of(client, "customer_alerts", base.key_prefix)
        stored = {
            k.decode(): int(v) for k, v in client.hgetall(registry.keys(generation).clocks).items()
        }
        assert {f: t for f, t in stored.items() if "|" not in f} == oracle.clocks, generation


def test_a_chained_event_time_processor_fires_its_alerts_live_and_on_replay(
    target, redis_url, kafka_bootstrap, make_topic
):
    events = list(OrderSimulator(2_000, seed=17))
    end = max(e.get("placed_at", 0) for _t, e in events) + DAY
    changes, log = _chain(target, make_topic, [*events, *_final_orders(end)], seed=5)
    markers = [r for r in log if read_marker(r.headers) is not None]
    assert markers, "order_state wrote no watermark markers"
    assert all(r.key is None and r.value is None for r in markers)
    assert {r.partition for r in markers} == set(range(DERIVED))  # every partition has some

    event_time = EVENT_TIME
    oracle = _oracle(changes, log, event_time, streams=True)
    assert len(oracle.effects) >= 3, len(oracle.effects)  # the alerts fire
    assert {e.value["event_count"] for e in oracle.effects} == {2}
    # Every derived partition's clock reached the final orders: the watermark moved past all.
    assert set(oracle.clocks) == {f"{changes}/{p}" for p in range(DERIVED)}
    assert min(oracle.clocks.values()) >= end
    # Judged per raw partition at this lateness, the interleaved streams would be late.
    raw = _oracle(changes, log, event_time, streams=False)
    assert len(raw.late) > 10 * max(1, len(oracle.late)), (len(raw.late), len(oracle.late))

    _check_generations(
        target, redis_url, kafka_bootstrap, make_topic, changes, log, event_time, oracle
    )


def test_an_idle_stream_does_not_hold_the_watermark_back_and_replays_alike(
    target, redis_url, kafka_bootstrap, make_topic
):
    events = list(OrderSimulator(1_500, seed=23))
    by_partition = [zlib.crc32(e["order_id"].encode()) % SOURCES for _t, e in events]
    quiet = by_partition[0]
    third = len(events) // 3
    # Source partition ``quiet`` goes quiet a third of the way (in event time, ~30 minutes
    # before the end): its stream's clock stays behind.
    kept = [e for i, e in enumerate(events) if i < third or by_partition[i] != quiet]
    changes, log = _chain(target, make_topic, kept, seed=9)

    held = _oracle(changes, log, EVENT_TIME, streams=True)
    idle = dataclasses.replace(EVENT_TIME, idle_ms=IDLE_MS)
    oracle = _oracle(changes, log, idle, streams=True)
    # Without the timeout the quiet stream holds every partition's clock back; with it they
    # move on with the other streams, to within the timeout of the newest.
    newest = max(
        CODEC.decode(r.value).data["changed_at"] for r in log if read_marker(r.headers) is None
    )
    assert max(held.clocks.values()) < newest - IDLE_MS
    assert min(oracle.clocks.values()) >= newest - IDLE_MS
    assert len(oracle.effects) > len(held.effects)
    assert oracle.late == []  # the quiet stream said nothing after it went quiet

    _check_generations(target, redis_url, kafka_bootstrap, make_topic, changes, log, idle, oracle)
