"""A window processor sharded by partition id: writer, reader, closer and replay admin, no Spark.

Each partition id's transaction writes its own share of every bucket, distinct-count sketch and
close timer under its shard's hash tag (``GenerationKeys.shards``); the reader, the closer and
``replay diff`` merge the shards (counts and sums add, extremes combine, a distinct count is
the union of the shards' HyperLogLogs). Run here on a single redis-server (8 shards), and again
on a real local cluster by ``test_redis_cluster.py``, which imports these tests: there no
transaction or multi-key command may cross two slots.
"""

from __future__ import annotations

import dataclasses
import random
import types
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from redis.crc import key_slot

from refold.contracts.codec import EventCodec
from refold.contracts.kafka.partitioner import key_partition
from refold.contracts.layout import position_field
from refold.contracts.origin import ORIGIN_ID
from refold.contracts.processors import EventTime, ProcessorSpec
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import SHARDS_FIELD, GenerationRegistry
from refold.contracts.windows import result_from_record
from refold.deploy.simulators.clickstream import ClickstreamSimulator
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import fold_windows
from refold.processors.fold.records import SourceRecord
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from refold.processors.runtime.window_store import WindowCloser
from refold.processors.sales_windows.config import SALES_WINDOWS
from refold.processors.sales_windows.projection import SalesWindows
from refold.processors.unique_visitors.config import UNIQUE_VISITORS
from refold.processors.unique_visitors.projection import UniqueVisitors
from refold.replay.generations_admin import collect_garbage, diff_generations
from refold.replay.in_place import _reset_state
from refold.replay.snapshots import SnapshotStore
from refold.services.reader.window_reader import WindowReader
from tests.support.topics import interleaved, random_chunks
from tests.support.windows import bucket_dump

SHARDS = 8
CODEC = EventCodec()


@dataclass
class Case:
    """A window processor, its records on 8 partitions (keyed as refold's producer keys them)."""

    fold: Any
    event_time: EventTime
    topic: str
    records: list[SourceRecord]

    def oracle_input(self):
        for record in self.records:
            decoded = CODEC.decode(record.value)
            field = position_field(record.topic, record.partition)
            yield field, record.offset, decoded.event_type, decoded.data


def _keyed(events, key: str, topic: str) -> list[SourceRecord]:
    offsets = [0] * SHARDS
    out = []
    for event_type, event in events:
        partition = key_partition(event[key], SHARDS)
        value = CODEC.encode(event_type, event)
        out.append(SourceRecord(topic, partition, offsets[partition], event[key].encode(), value))
        offsets[partition] += 1
    return out


def sales() -> Case:
    """sales_windows: payments, tumbling, hopping and sliding windows, distinct methods."""
    events = list(OrderSimulator(700, seed=41, anomaly_rate=0))
    records = _keyed(events, "order_id", "orders")
    return Case(SalesWindows(), SALES_WINDOWS.event_time, "orders", records)


def visits() -> Case:
    """unique_visitors: hourly distinct visitors (sketches of hundreds), late views accepted."""
    events = ClickstreamSimulator(1200, seed=5, late_rate=0.02, sessions_per_second=0.1)
    views = [(t, e) for t, e in events if t == "PageViewed"]
    records = _keyed(views, "session_id", "web.pageviews")
    return Case(UniqueVisitors(), UNIQUE_VISITORS.event_time, "web.pageviews", records)


class Generations:
    """One window processor's generations: sharded 8 ways, or one slot."""

    def __init__(self, target: FoldTarget, case: Case) -> None:
        self.case = case
        self.target = dataclasses.replace(
            target, processor=case.fold.name, event_time=case.event_time, topics=(case.topic,)
        )
        self.client = redis_client(target.redis_url)
        self.registry = GenerationRegistry.of(self.client, case.fold.name, target.key_prefix)

    def create(self, shards: int, live: bool = False, **meta: Any) -> FoldTarget:
        generation = self.registry.create({SHARDS_FIELD: shards, **meta}, live=live)
        return dataclasses.replace(self.target, generation=generation, shards=shards)

    def apply(self, target: FoldTarget, seed: int | None, close=None) -> None:
        """Every record, in chunks cut by ``seed`` (None: one call), ``close`` after each."""
        writer = FoldWriter(target, self.case.fold)
        rng = random.Random(seed)
        chunks = (
            [self.case.records]
            if seed is None
            else random_chunks(interleaved(self.case.records, rng), rng, 300)
        )
        for batch_id, chunk in enumerate(chunks):
            writer.apply(chunk, batch_id=batch_id)
            if close is not None:
                close()

    def buckets(self, generation: int) -> dict:
        """Every bucket of a generation, its shards' shares combined."""
        merged: dict = {}
        for shard in self.registry.keys(generation).each_shard():
            for bucket, fields in bucket_dump(self.client, shard).items():
                into = merged.setdefault(bucket, {})
                for name, value in fields.items():
                    if name.startswith("min:"):
                        into[name] = min(into.get(name, value), value)
                    elif name.startswith("max:"):
                        into[name] = max(into.get(name, value), value)
                    else:
                        into[name] = into.get(name, 0) + value
        return merged

    def closer(self, generation: int, topic: str, kafka: str) -> WindowCloser:
        return WindowCloser(
            self.target.layout,
            generation,
            self.case.fold,
            self.case.event_time.lateness_ms,
            self.target.redis_url,
            {"bootstrap.servers": kafka},
            topic,
        )


@pytest.mark.parametrize("make", [sales, visits], ids=["sales_windows", "unique_visitors"])
def test_sharded_windows_read_as_the_oracle_and_as_one_slot(target, make):
    case = make()
    gens = Generations(target, case)
    one_slot = gens.create(0)
    sharded = gens.create(SHARDS, live=True)
    gens.apply(one_slot, None)
    gens.apply(sharded, seed=3)
    gens.apply(sharded, seed=4)  # re-executed batches, cut another way, change nothing
    oracle = fold_windows(case.fold, case.event_time, case.oracle_input())
    assert gens.buckets(sharded.generation) == oracle.buckets == gens.buckets(one_slot.generation)
    keys = gens.registry.keys(sharded.generation)
    assert keys.shards == SHARDS
    # Every shard wrote its own share, in its own slot; nothing under the generation's tag.
    for shard in keys.each_shard():
        names = list(gens.client.scan_iter(match=shard.namespace_pattern("w"), count=1000))
        assert names, shard.shard
        assert {key_slot(n) for n in names} == {key_slot(shard.positions.encode())}
    assert list(gens.client.scan_iter(match=f"{keys.home}:w*")) == []

    lateness = case.event_time.lateness_ms
    reader = WindowReader.from_fold(gens.client, case.fold, target.key_prefix, lateness_ms=lateness)
    windows = {w.name: w for w in case.fold.windows}
    by_window: dict[str, set] = {}
    for name, start, group in oracle.buckets:
        by_window.setdefault(name, set()).update((e, group) for e in windows[name].ends(start))
    compared = 0
    for name, found in sorted(by_window.items()):
        for end, group in sorted(found)[:150]:
            read = reader.window(name, group, end).value
            # The union of the shards' sketches is exactly the one-slot sketch.
            assert read == reader.window(name, group, end, one_slot.generation).value
            expected = oracle.window(windows[name], end, group)
            assert {k: v for k, v in read.items() if not k.startswith("distinct:")} == {
                k: v for k, v in expected.items() if not k.startswith("distinct:")
            }
            for measure in case.fold.distinct:
                got, exact = read[f"distinct:{measure}"], expected[f"distinct:{measure}"]
                assert got == pytest.approx(exact, rel=0.03, abs=1)
            compared += 1
        group = sorted(found)[0][1]
        span = (min(e for e, _g in found) - 1, max(e for e, _g in found))
        assert reader.range(name, group, *span).value == (
            reader.range(name, group, *span, one_slot.generation).value
        )
        assert reader.groups(name).value == reader.groups(name, one_slot.generation).value
    assert compared >= 20
    # A day's distinct count over every hour: the union of 8 shards x 24 sketches.
    name, measure = case.fold.windows[0].name, case.fold.distinct[0]
    for group in reader.groups(name).value:
        first = min(s for (_w, s, _g) in oracle.buckets)
        day = reader.distinct(name, measure, group, first, first + 86_400_000).value
        assert (
            day
            == reader.distinct(
                name, measure, group, first, first + 86_400_000, one_slot.generation
            ).value
        )
        assert day > 0
    watermark = reader.watermark().value
    assert watermark.watermark == min(oracle.clocks.values()) - case.event_time.lateness_ms
    spec = ProcessorSpec(
        name=case.fold.name, projection="x:y", topics=(case.topic,), key="k", tables=()
    )
    diff = diff_generations(spec, gens.client, target.key_prefix, 1, 2)
    assert diff.identical, diff.render()
    assert diff.buckets_compared == len(oracle.buckets)


def _results(bootstrap: str, topic: str) -> list[tuple[dict, bytes]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "t", "enable.auto.commit": "false"}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    found: list = []
    for _ in range(40):
        batch = [m for m in consumer.consume(1000, timeout=0.5) if m.error() is None]
        found += batch
        if not batch and found:
            break
    consumer.close()
    return [
        (result_from_record(CODEC.decode(m.value()).data), dict(m.headers())[ORIGIN_ID])
        for m in found
    ]


def test_the_closer_emits_each_window_once_merged_over_the_shards_as_one_slot_would(
    target, kafka_bootstrap, make_topic
):
    case = sales()
    gens = Generations(target, case)
    sharded = gens.create(SHARDS, live=True)
    sharded_topic, one_slot_topic = (make_topic(partitions=1, prefix=p) for p in ("sh", "one"))
    closer = gens.closer(sharded.generation, sharded_topic, kafka_bootstrap)
    # Closing after every batch, the log folded twice with different cuts (the second time
    # every record is skipped): each window goes out once, whichever shard's timer fires.
    gens.apply(sharded, seed=1, close=closer.close)
    gens.apply(sharded, seed=2, close=closer.close)
    assert closer.close() == 0
    # The reference: the same processor in one slot, live on its own (another key prefix).
    alone = Generations(dataclasses.replace(target, key_prefix=f"{target.key_prefix}-1"), case)
    one_slot = alone.create(0, live=True)
    alone.apply(one_slot, seed=None)
    reference = alone.closer(one_slot.generation, one_slot_topic, kafka_bootstrap)
    assert reference.close() > 0

    emitted = _results(kafka_bootstrap, sharded_topic)
    ids = [(r["window"], r["end"], r["group"]) for r, _id in emitted]
    assert len(ids) == len(set(ids)) == closer.done
    # Windows closed as they came: the later ones are those the reference closed at once.
    expected = {
        (r["window"], r["end"], r["group"]): origin
        for r, origin in _results(kafka_bootstrap, one_slot_topic)
    }
    assert set(ids) <= set(expected)
    last = {(w, e, g) for (w, e, g) in expected if e <= closer.watermark()}
    assert set(ids) == last
    oracle = fold_windows(case.fold, case.event_time, case.oracle_input())
    windows = {w.name: w for w in case.fold.windows}
    for result, origin in emitted:
        assert result == oracle.window(windows[result["window"]], result["end"], result["group"])
        # The same result as one slot emits: the same origin id, so no consumer sees it twice.
        assert origin == expected[(result["window"], result["end"], result["group"])]
    # Every shard's close timer of an emitted window is gone; expiry ran on every shard.
    for shard in gens.registry.keys(sharded.generation).each_shard():
        due = gens.client.zrangebyscore(shard.timers("close"), "-inf", closer.watermark())
        assert due == []


def test_snapshots_diff_reset_and_gc_take_every_shard_of_a_window_processor(target, tmp_path):
    case = visits()
    gens = Generations(target, case)
    first = gens.create(SHARDS, live=True)
    gens.apply(first, seed=9)

    def state(generation: int) -> dict:
        keys = gens.registry.keys(generation)
        out = {}
        for shard in keys.each_shard():
            for raw in gens.client.scan_iter(match=shard.pattern(), count=1000):
                name = raw.decode()
                if keys.is_state_key(name):
                    out[(shard.shard, name[len(shard.base) + 1 :])] = gens.client.dump(name)
        return out

    before = state(first.generation)
    for namespace in ("w:", "wd:", "tm:close", "tm:expire", "wm:", "positions"):
        assert {s for s, n in before if n.startswith(namespace)} == set(range(SHARDS)), namespace
    store = SnapshotStore(gens.registry)
    snapshot = store.take(first.generation)
    second = gens.registry.create({SHARDS_FIELD: ""})  # a replay's: takes the snapshot's shards
    store.seed(snapshot, second)
    assert state(second) == before
    spec = ProcessorSpec(
        name=case.fold.name, projection="x:y", topics=(case.topic,), key="k", tables=()
    )
    assert diff_generations(
        spec, gens.client, target.key_prefix, first.generation, second
    ).identical
    shard = gens.registry.keys(second).for_shard(5)
    bucket = next(iter(gens.client.scan_iter(match=shard.namespace_pattern("w:"))))
    gens.client.hincrby(bucket, "count", 1)
    diff = diff_generations(spec, gens.client, target.key_prefix, first.generation, second)
    assert len(diff.buckets_differing) == 1
    begin = types.SimpleNamespace(topic=case.topic, partition=0, begin=0)
    removed = _reset_state(gens.registry, second, types.SimpleNamespace(partitions=[begin]), None)
    assert removed == len(before)
    assert {n for _s, n in state(second)} == {"positions"}
    gens.registry.flip(second)
    collect_garbage(spec, gens.client, target.key_prefix, str(tmp_path), execute=True)
    assert state(first.generation) == {}
    keys = gens.registry.keys(first.generation)
    assert [n for p in keys.patterns() for n in gens.client.scan_iter(match=p)] == []
