"""A generation sharded by partition id: its hash tags, keys and positions (pure, no server)."""

from collections import Counter

import pytest
import redis
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from refold.contracts.kafka.partitioner import key_partition, murmur2
from refold.contracts.layout import StateLayout, shard_tag
from refold.contracts.store.positions import Applied, GenerationPositions
from refold.contracts.topics import TopicSpec
from refold.processors.enriched_clicks.projection import EnrichedClicksProjection
from refold.processors.fold.records import SourceRecord
from refold.processors.fold.rekey import Keying
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.shards import split_by_shard, wanted_shards
from refold.processors.sales_windows.projection import SalesWindows

SHARDED = StateLayout("order_state", "p").generation(4, shards=8)


def _master(slot: int, masters: int = 3) -> int:
    """The master owning ``slot`` when a cluster is created with equal contiguous ranges."""
    return slot * masters // REDIS_CLUSTER_HASH_SLOTS


def test_kafkas_murmur2_vectors():
    # Kafka's own test vectors (UtilsTest.testMurmur2), as signed 32-bit integers.
    signed = {
        b"21": -973932308,
        b"foobar": -790332482,
        b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        b"abc": 479470107,
    }
    for data, expected in signed.items():
        assert murmur2(data) == expected & 0xFFFFFFFF
    assert key_partition("foobar", 1) == 0
    assert key_partition("21", 8) == key_partition(b"21", 8) == (-973932308 & 0x7FFFFFFF) % 8


def test_each_shard_tag_lands_in_the_middle_of_its_share_of_the_slots():
    for shards in (1, 3, 8, 64, 1024):
        tags = [shard_tag("order_state", 4, s, shards) for s in range(shards)]
        assert len(set(tags)) == shards
        share = REDIS_CLUSTER_HASH_SLOTS / shards
        for shard, tag in enumerate(tags):
            assert shard * share <= key_slot(tag.encode()) < (shard + 1) * share
            assert tag.startswith(f"order_state.g4.s{shard}")
    # On M masters of contiguous slot ranges, each holds the floor or ceiling of shards / M,
    # whatever the processor and generation: 8 shards on 3 masters are 3, 2 and 3.
    for processor, generation in (("order_state", 1), ("order_state", 4), ("customer_stats", 9)):
        for shards, masters in ((8, 3), (4, 3), (12, 3), (16, 5)):
            per_master = Counter(
                _master(key_slot(shard_tag(processor, generation, s, shards).encode()), masters)
                for s in range(shards)
            )
            assert max(per_master.values()) - min(per_master.values()) <= 1
            assert len(per_master) == min(masters, shards)


def test_keys_of_a_million_orders_spread_over_the_masters_near_evenly():
    # What a 1M-key entity processor on 8 partitions puts on each of 3 masters: its share
    # within ~2x (the bound), from murmur2's spread and the tags' placement.
    per_master: Counter[int] = Counter()
    slot_of_shard = [key_slot(SHARDED.for_shard(s).base.encode()) for s in range(8)]
    for i in range(1_000_000):
        per_master[_master(slot_of_shard[key_partition(f"o-{i}", 8)])] += 1
    share = 1_000_000 / 3
    assert max(per_master.values()) < 1.3 * share
    assert min(per_master.values()) > 0.6 * share


def test_a_shard_holds_what_its_transactions_write_and_the_generation_the_rest():
    shard = SHARDED.for_shard(5)
    tag = "{" + shard_tag("order_state", 4, 5, 8) + "}"
    for key in (
        shard.positions,
        shard.guard("orders/5"),
        shard.table("orders", "o-1"),
        shard.aggregate("order_totals"),
        shard.stats,
        shard.dead_letters,
        shard.clocks,
        shard.entity_timers(5),
    ):
        assert tag in key
    for key in (shard.meta, shard.lease, shard.builder, SHARDED.meta, SHARDED.positions):
        assert "{order_state.g4}" in key
    assert [k.shard for k in SHARDED.each_shard()] == list(range(8))
    with pytest.raises(ValueError, match="shard 8"):
        SHARDED.for_shard(8)
    plain = StateLayout("order_state", "p").generation(4)
    assert plain.for_shard(3) is plain
    assert plain.each_shard() == [plain]


def test_sharded_positions_read_each_shard_and_start_in_the_partitions_shard():
    applied = GenerationPositions(redis.Redis(), SHARDED)
    assert applied.hashes() == [SHARDED.for_shard(s).positions for s in range(8)]
    pipe = redis.Redis().pipeline(transaction=False)  # queues only: no server is reached
    assert applied.queue(pipe) == 8
    applied.start(pipe, "orders/6", 11)
    assert [args for args, _ in pipe.command_stack][-1] == (
        "HSETNX",
        SHARDED.for_shard(6).positions,
        "orders/6",
        "11",
    )
    replies = [{b"orders/0": b"4", b"batch_id": b"2"}, {}, {b"orders/2": b"9", b"batch_id": b"3"}]
    # A partition's position is its shard's; the batch id the latest any shard applied.
    assert applied.parse_replies(replies) == Applied({("orders", 0): 4, ("orders", 2): 9}, 3)
    writer = GenerationPositions(redis.Redis(), SHARDED.for_shard(2))
    assert writer.writer_key() == SHARDED.for_shard(2).positions
    with pytest.raises(ValueError, match="not sharded"):
        GenerationPositions(redis.Redis(), SHARDED, slots=2)


def test_a_transaction_is_split_by_partition_id_in_shard_order():
    records = [SourceRecord("b", 1, 0, b"k", b""), SourceRecord("a", 0, 3, b"k", b"")]
    records.append(SourceRecord("a", 1, 7, b"k", b""))
    parts = split_by_shard(records, {"a/2": (0, 5), "b/1": (0, 1)})
    assert [(shard, [(r.topic, r.offset) for r in rs], cov) for shard, rs, cov in parts] == [
        (0, [("a", 3)], {}),
        (1, [("b", 0), ("a", 7)], {"b/1": (0, 1)}),
        (2, [], {"a/2": (0, 5)}),
    ]


def test_new_generations_of_entity_folds_are_sharded_on_a_cluster_and_windows_are_not():
    orders = [TopicSpec("orders", 8, "order_id", ("OrderPaid",))]
    fold = OrderStateProjection()
    assert wanted_shards(fold, orders, None, "auto", cluster=True) == 8
    assert wanted_shards(fold, orders, None, "auto", cluster=False) == 0
    assert wanted_shards(fold, orders, None, "on", cluster=False) == 8
    assert wanted_shards(fold, orders, None, "off", cluster=True) == 0
    # auto keeps window processors in one slot, as measured (bench cluster --windows); on
    # shards them too (state that outgrows one master).
    assert wanted_shards(SalesWindows(), orders, None, "auto", cluster=True) == 0
    assert wanted_shards(SalesWindows(), orders, None, "on", cluster=False) == 8
    rekeyed = Keying(4, "currency", (), (("orders", "order_id"),), "keyed by currency")
    assert wanted_shards(SalesWindows(), orders, rekeyed, "on", cluster=True) == 0
    # A lookup join keeps state several partitions share: one slot.
    assert wanted_shards(EnrichedClicksProjection(), orders, None, "on", cluster=True) == 0
