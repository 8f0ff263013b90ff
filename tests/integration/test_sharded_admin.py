"""replay's admin operations on generations sharded by partition id, slot by slot.

A sharded generation (``GenerationKeys.shards``) keeps each partition id's state under its
shard's own hash tag: snapshots copy and seed it shard by shard, ``replay diff`` compares it by
key names without the shards' bases (aggregates as the sum of the shards' shares), an in-place
reset empties every shard and gc removes every shard's keys. Run here on a single redis-server,
and again on a real local cluster by ``test_redis_cluster.py``, which imports these tests: no
multi-key command or transaction there may cross two slots.
"""

import dataclasses
import threading
import time
import types

import pytest
from redis.crc import key_slot

from refold.contracts.kafka.partitioner import key_partition
from refold.contracts.processors import ProcessorSpec
from refold.contracts.registry import processor_spec
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import SHARDS_FIELD, GenerationRegistry
from refold.contracts.store.stats import ProcessorStats
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import fold_all
from refold.processors.runtime.envelope import FoldWriter
from refold.replay.generations_admin import collect_garbage, diff_generations
from refold.replay.in_place import _reset_state
from refold.replay.snapshots import SnapshotError, SnapshotStore
from refold.services.reader.state_reader import StateReader
from tests.integration.test_sharded_writer import (  # noqa: F401 - the fixture
    PARTITIONS,
    P,
    keyed_records,
    sharded,
)

SPEC: ProcessorSpec = processor_spec("order_state")


class Sharded:
    """Orders keyed onto 4 partitions, and the sharded live generation 1 of order_state."""

    def __init__(self, target, events=240, seed=17):
        self.target = target
        self.events = list(OrderSimulator(events, seed=seed, anomaly_rate=0))
        self.records, self.ends = keyed_records(self.events)
        self.client = redis_client(target.redis_url)
        self.registry = GenerationRegistry(self.client, target.layout)
        self.reader = StateReader(self.client, "order_state", target.key_prefix)

    def create(self, shards=PARTITIONS):
        """A new building generation, sharded ``shards`` ways (0: unsharded)."""
        return self.registry.create({SHARDS_FIELD: shards} if shards else {})

    def writer(self, generation, shards=PARTITIONS):
        target = dataclasses.replace(self.target, generation=generation, shards=shards)
        return FoldWriter(target, P)

    def oracle(self, positions=None):
        """The fold of every record below ``positions`` (all of them: None)."""
        return fold_all(
            P,
            [
                pair
                for record, pair in zip(self.records, self.events, strict=True)
                if positions is None or record.offset < positions.get(("orders", record.partition))
            ],
        )

    def assert_state(self, generation, positions=None):
        """The generation's entities and aggregate equal the oracle's (at ``positions``)."""
        expected = self.oracle(positions)
        assert dict(self.reader.scan("orders", generation)) == expected.states
        assert self.reader.aggregate("order_totals", generation).value == dict(expected.aggregate)

    def names(self, generation):
        """Every key of ``generation``: under its own tag or any shard's."""
        keys = self.registry.keys(generation)
        return {n.decode() for p in keys.patterns() for n in self.client.scan_iter(match=p)}

    def state_names(self, generation):
        keys = self.registry.keys(generation)
        return {n for n in self.names(generation) if keys.is_state_key(n)}


@pytest.fixture
def sharded_orders(sharded):  # noqa: F811 - the fixture imported above
    return Sharded(sharded)


def _partial(orders):
    """The first ~half of each partition's records."""
    return [r for r in orders.records if r.offset < orders.ends[r.partition] // 2 + 1]


def test_a_snapshot_copies_each_shard_in_its_slot_and_seeds_the_same_shards(sharded_orders):
    orders = sharded_orders
    live = orders.target.generation
    writer = orders.writer(live)
    first = _partial(orders)
    writer.apply(first, batch_id=0)
    store = SnapshotStore(orders.registry)
    snapshot = store.take(live)
    writer.apply(orders.records, batch_id=1)  # the live generation moves on
    assert snapshot.shards == PARTITIONS
    assert snapshot.positions == {("orders", p): orders.ends[p] // 2 + 1 for p in range(PARTITIONS)}
    # Each shard's copy is in its own slot (its COPY ran in the shard's transaction), and the
    # record in the generation's home.
    copied = 0
    for shard in orders.registry.keys(live).each_shard():
        names = list(orders.client.scan_iter(match=f"{shard.base}:snap:{snapshot.snapshot}:*"))
        assert f"{shard.base}:snap:{snapshot.snapshot}:positions".encode() in names
        assert {key_slot(n) for n in names} == {key_slot(shard.positions.encode())}
        copied += len(names)
    assert copied == snapshot.keys
    assert [s.name for s in store.list(live)] == [snapshot.name]
    assert store.list(live)[0].shards == PARTITIONS

    seeded = orders.create()
    assert store.seed(snapshot, seeded) == snapshot.keys
    orders.assert_state(seeded, snapshot.positions)
    assert orders.registry.positions(seeded)[0] == snapshot.positions
    for shard in orders.registry.keys(seeded).each_shard():  # each partition in its shard
        assert orders.client.hget(shard.positions, f"orders/{shard.shard}") is not None
    # Folding the log on from the seed gives the whole fold (what is below it is skipped).
    outcome = orders.writer(seeded).apply(orders.records, batch_id=0)
    assert outcome.skipped == len(first)
    orders.assert_state(seeded)
    assert diff_generations(SPEC, orders.client, orders.target.key_prefix, live, seeded).identical

    # A replay's generation, its shards undecided until its processor's first run: the
    # snapshot's, recorded by the seed (the processor then keeps them).
    undecided = orders.registry.create({SHARDS_FIELD: ""})
    store.seed(snapshot, undecided)
    assert orders.registry.meta(undecided)[SHARDS_FIELD] == str(PARTITIONS)
    orders.assert_state(undecided, snapshot.positions)

    # Across shard counts: refused, naming the fix, nothing copied.
    for shards in (0, 2):
        other = orders.create(shards)
        with pytest.raises(SnapshotError, match=f"sharded {PARTITIONS} ways.*rebuild"):
            store.check_seedable(snapshot, other)  # what an in-place reset asks first
        with pytest.raises(SnapshotError, match=f"sharded {PARTITIONS} ways.*rebuild"):
            store.seed(snapshot, other)
        assert orders.state_names(other) == set()
    assert store.delete(live, snapshot.snapshot) == snapshot.keys
    assert store.list(live) == []
    assert not any(":snap:" in n for n in orders.names(live))


def test_sharded_snapshots_taken_while_batches_commit_are_consistent_per_shard(sharded_orders):
    """Each snapshot's state equals the oracle's at its positions, which each shard copied."""
    orders = sharded_orders
    live = orders.target.generation
    writer = orders.writer(live)
    store = SnapshotStore(orders.registry)
    chunks = [orders.records[i : i + 15] for i in range(0, len(orders.records), 15)]
    snapshots = []
    done = threading.Event()

    def commit():
        try:
            for batch, chunk in enumerate(chunks):  # each chunk: a transaction per shard
                taken = len(snapshots)
                writer.apply(chunk, batch_id=batch)
                time.sleep(0.01)  # spread the commits so that snapshots land between them
                # Every other commit waits (bounded) for a snapshot after it, as in
                # test_replay_execution: a snapshot lists a shard's keys with SCAN inside its
                # WATCH, which on the suite's shared Redis walks every test's keys, so
                # back-to-back commits overtook all of its 50 attempts once (CI, 3 workers).
                deadline = time.monotonic() + 5
                while batch % 2 == 0 and len(snapshots) == taken and time.monotonic() < deadline:
                    time.sleep(0.001)
        finally:
            done.set()

    writer.apply(chunks[0], batch_id=0)
    thread = threading.Thread(target=commit)
    thread.start()
    while not done.is_set() or not snapshots:
        snapshots.append(store.take(live))
    thread.join()
    assert len({sum(s.positions.values()) for s in snapshots}) > 1  # taken mid-stream
    for snapshot in snapshots[:: max(1, len(snapshots) // 3)]:
        seeded = orders.create()
        store.seed(snapshot, seeded)
        orders.assert_state(seeded, snapshot.positions)


def test_diff_compares_sharded_generations_by_key_and_aggregates_by_their_sum(sharded_orders):
    orders = sharded_orders
    live = orders.target.generation
    orders.writer(live).apply(orders.records, batch_id=0)
    other, unsharded = orders.create(), orders.create(0)
    orders.writer(other).apply(orders.records, batch_id=0)
    orders.writer(unsharded, shards=0).apply(orders.records, batch_id=0)
    prefix = orders.target.key_prefix

    def diff(a, b):
        return diff_generations(SPEC, orders.client, prefix, a, b)

    equal = diff(live, other)
    assert equal.identical, equal.render()
    assert equal.compared == equal.same == len(orders.oracle().states)
    assert diff(live, unsharded).identical  # either may be sharded
    assert diff(unsharded, other).identical

    keys = orders.registry.keys(other)
    # A share moved from one shard to another: the sums are equal, so is the aggregate.
    field = next(iter(orders.client.hkeys(keys.for_shard(0).aggregate("order_totals"))))
    orders.client.hincrby(keys.for_shard(0).aggregate("order_totals"), field, -1)
    orders.client.hincrby(keys.for_shard(1).aggregate("order_totals"), field, 1)
    assert diff(live, other).identical
    changed, gone = sorted(orders.oracle().states)[:2]
    shard = keys.for_shard(key_partition(changed, PARTITIONS))
    orders.client.set(shard.table("orders", changed), '{"status": "lost"}')
    orders.client.delete(keys.for_shard(key_partition(gone, PARTITIONS)).table("orders", gone))
    orders.client.hincrby(keys.for_shard(3).aggregate("order_totals"), field, 1)
    found = diff(live, other)
    assert found.differing == [f"orders:{changed}"]
    assert found.only_in_a == [f"orders:{gone}"]
    assert found.only_in_b == []
    in_a, in_b = found.aggregates_differing["order_totals"]
    assert in_b[field.decode()] == in_a[field.decode()] + 1
    assert "NOT identical" in found.render()


def test_in_place_reset_empties_every_shard_and_restores_a_snapshot_by_shard(sharded_orders):
    orders = sharded_orders
    live = orders.target.generation
    writer = orders.writer(live)
    writer.apply(_partial(orders), batch_id=0)
    store = SnapshotStore(orders.registry)
    snapshot = store.take(live)
    writer.apply(orders.records, batch_id=1)
    keys = orders.registry.keys(live)
    state = orders.state_names(live)
    assert {n for n in state if ":guard:" in n}  # a guard per partition, in its shard

    def plan(begins):
        return types.SimpleNamespace(
            partitions=[
                types.SimpleNamespace(topic="orders", partition=p, begin=b)
                for p, b in enumerate(begins)
            ]
        )

    removed = _reset_state(orders.registry, live, plan([0] * PARTITIONS), None)
    assert removed == len(state)
    # What is left of the state: where folding restarts, each partition's in its shard.
    assert orders.state_names(live) == {s.positions for s in keys.each_shard()}
    assert orders.registry.positions(live)[0] == {("orders", p): 0 for p in range(PARTITIONS)}
    assert ProcessorStats(orders.client, orders.registry.layout).read(live).events == 0
    assert dict(orders.reader.scan("orders", live)) == {}
    orders.writer(live).apply(orders.records, batch_id=0)  # folds everything again
    orders.assert_state(live)

    # From the snapshot (kept by the reset: it is not state): each shard its own copy.
    begins = [snapshot.positions[("orders", p)] for p in range(PARTITIONS)]
    _reset_state(orders.registry, live, plan(begins), snapshot)
    orders.assert_state(live, snapshot.positions)
    assert orders.registry.positions(live)[0] == snapshot.positions
    outcome = orders.writer(live).apply(orders.records, batch_id=0)
    assert outcome.applied == len(orders.records) - sum(begins)
    orders.assert_state(live)


def test_gc_removes_every_key_of_a_sharded_generation(sharded_orders, tmp_path):
    orders = sharded_orders
    live = orders.target.generation
    orders.writer(live).apply(orders.records, batch_id=0)
    SnapshotStore(orders.registry).take(live)
    ProcessorStats(orders.client, orders.registry.layout).record_batch(
        live, 0, 1, 0, 0, {}, 10.0, None, now_ms=1
    )
    after = orders.create()
    orders.writer(after).apply(orders.records, batch_id=0)
    names = orders.names(live)
    keys = orders.registry.keys(live)
    for shard in keys.each_shard():  # every shard holds state, stats and a snapshot's copy
        assert {f"{shard.positions}", f"{shard.stats}"} <= names
        assert any(n.startswith(f"{shard.base}:snap:") for n in names)
    assert keys.meta in names
    orders.registry.flip(after)

    removed = collect_garbage(
        SPEC, orders.client, orders.target.key_prefix, str(tmp_path), execute=True
    )
    assert removed == [(live, len(names))]
    assert orders.registry.status(live) is None
    for pattern in keys.patterns():  # nothing left, in any shard's slot
        assert list(orders.client.scan_iter(match=pattern)) == []
    tags = (f"{{order_state.g{live}}}", f"{{order_state.g{live}.s")
    left = [
        n
        for n in orders.client.scan_iter(match=f"{orders.target.key_prefix}:*")
        if n.decode().split(":", 1)[1].startswith(tags)
    ]
    assert left == []
    orders.assert_state(after)  # the live generation is untouched
