"""A generation sharded by partition id: the fold writer and the reader, without Spark.

Each partition id's positions, guards, entities, aggregate share, stats and dead letters live
under the shard's own hash tag (``GenerationKeys.shards``), so every transaction stays in one
Redis Cluster slot. Run here on a single redis-server, and again on a real local cluster by
``test_redis_cluster.py``, which imports these tests.
"""

import dataclasses

import pytest
from redis.crc import key_slot

from refold.contracts.codec import EventCodec
from refold.contracts.kafka.partitioner import key_partition
from refold.contracts.store.connect import is_cluster, redis_client
from refold.contracts.store.generations import SHARDS_FIELD, GenerationRegistry
from refold.contracts.store.stats import ProcessorStats
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import fold_all
from refold.processors.fold.records import SourceRecord
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.envelope import FoldWriter
from refold.services.reader.state_reader import StateReader

P = OrderStateProjection()
PARTITIONS = 4


def keyed_records(events, partitions=PARTITIONS, topic="orders"):
    """Records where refold's producer puts them: by murmur2 of the order id."""
    codec = EventCodec()
    offsets = [0] * partitions
    out = []
    for event_type, event in events:
        partition = key_partition(event["order_id"], partitions)
        key = event["order_id"].encode()
        out.append(
            SourceRecord(topic, partition, offsets[partition], key, codec.encode(event_type, event))
        )
        offsets[partition] += 1
    return out, offsets


@pytest.fixture
def sharded(target):
    """Generation 1 of order_state, sharded by its 4 partition ids, live."""
    client = redis_client(target.redis_url)
    registry = GenerationRegistry(client, target.layout)
    assert registry.create({SHARDS_FIELD: PARTITIONS}, live=True) == target.generation
    return dataclasses.replace(target, shards=PARTITIONS)


def test_a_sharded_generation_equals_the_oracle_and_replaying_changes_nothing(sharded):
    events = list(OrderSimulator(400, seed=31, anomaly_rate=0))
    records, ends = keyed_records(events)
    writer = FoldWriter(sharded, P)
    half = len(records) // 2
    # Records of every partition in one call: one transaction per shard.
    first = writer.apply(records[:half], batch_id=0)
    second = writer.apply(records[half:], batch_id=1)
    assert first.applied + second.applied == len(records)

    oracle = fold_all(P, events)
    reader = StateReader.from_url(sharded.redis_url, "order_state", sharded.key_prefix)
    assert dict(reader.scan("orders")) == oracle.states
    total = reader.aggregate("order_totals")
    assert total.value == dict(oracle.aggregate)
    assert total.positions == {("orders", p): end for p, end in enumerate(ends)}
    some = sorted(oracle.states)[:7]
    one = reader.get("orders", some[0])
    assert one.value == oracle.states[some[0]]
    # The entity's shard: the positions of its partition, on which all its events are.
    partition = key_partition(some[0], PARTITIONS)
    assert one.positions == {("orders", partition): ends[partition]}
    many = reader.get_many("orders", [*some, "no-such-order"])
    assert many.value == {**{k: oracle.states[k] for k in some}, "no-such-order": None}
    assert set(many.positions) == {("orders", key_partition(k, PARTITIONS)) for k in some} | {
        ("orders", key_partition("no-such-order", PARTITIONS))
    }

    client = redis_client(sharded.redis_url)
    registry = GenerationRegistry(client, sharded.layout)
    assert registry.positions(1) == ({("orders", p): e for p, e in enumerate(ends)}, 1)
    again = writer.apply(records, batch_id=1)  # a re-executed batch changes nothing
    assert (again.applied, again.skipped) == (0, len(records))
    assert dict(reader.scan("orders")) == oracle.states
    assert reader.aggregate("order_totals").value == dict(oracle.aggregate)
    counted = ProcessorStats(client, sharded.layout).read(1)
    assert counted.events == len(records) - len(oracle.rejected) - oracle.passed


def test_each_shards_keys_are_in_its_own_slot(sharded):
    events = list(OrderSimulator(120, seed=7, anomaly_rate=0))
    records, _ends = keyed_records(events)
    FoldWriter(sharded, P).apply(records, batch_id=0)
    client = redis_client(sharded.redis_url)
    keys = sharded.keys
    for shard in keys.each_shard():
        names = list(client.scan_iter(match=f"{shard.base}:*", count=1000))
        assert shard.positions.encode() in names
        assert {key_slot(n) for n in names} == {key_slot(shard.positions.encode())}
    # Nothing of the fold was written under the generation's own tag.
    assert list(client.scan_iter(match=f"{keys.home}:t:*")) == []
    if is_cluster(client):  # 4 shards over 3 masters: every master holds one or two
        owners = {client.get_node_from_key(s.positions).name for s in keys.each_shard()}
        assert len(owners) == 3


def test_a_bad_record_is_dead_lettered_and_indexed_in_its_shard(sharded, kafka_bootstrap):
    events = list(OrderSimulator(20, seed=3, anomaly_rate=0))
    records, ends = keyed_records(events)
    bad = SourceRecord("orders", 2, ends[2], b"k1", b"not avro at all")
    outcome = FoldWriter(sharded, P).apply([*records, bad], batch_id=0)
    assert outcome.undecodable == 1
    assert outcome.positions["orders/2"] == ends[2] + 1
    client = redis_client(sharded.redis_url)
    index = client.hgetall(sharded.keys.for_shard(2).dead_letters)
    assert index == {f"orders/2@{ends[2]}.0".encode(): b"bad-magic"}
    assert ProcessorStats(client, sharded.layout).read(1).dead_letters == {"bad-magic": 1}
