"""refold on a real Redis Cluster: 3 masters with 1 replica each, as `refold up --redis-cluster`.

This module's ``redis_url`` is the cluster's, so the exactly-once scenarios imported below run
here a second time, with the session's broker: the fold writer against the oracle (re-executed
and overlapping batches, concurrent writers, a reader across a flip), re-keyed writer slots,
windows and their closer across a flip, snapshots taken while batches commit, seeds, diffs,
in-place resets, rollback and gc, every state kind's lifecycle, a kind added as a module, a
window processor sharded by partition id (its shards' buckets and sketches merged by the reader,
the closer and diff), and the HTTP query paging through a cutover (over a sharded generation
too). Then a master is killed under traffic.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from refold.contracts.commerce import ORDERS
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import SHARDS_FIELD, GenerationRegistry
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import fold_all
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.envelope import FoldWriter
from refold.services.reader.state_reader import StateReader
from tests.integration.test_added_state_kind import (  # noqa: F401 - run here on the cluster
    test_a_kind_added_as_a_module_folds_replays_snapshots_diffs_resets_and_is_collected,
    top_kind,
)
from tests.integration.test_api_keys import (  # noqa: F401
    client,
    prefix,
    store,
    test_a_key_over_its_rate_limit_gets_429_with_retry_after_and_other_keys_go_on,
)
from tests.integration.test_flip_between_reads import (  # noqa: F401
    test_status_and_live_reads_one_transaction_on_any_redis,
)
from tests.integration.test_fold_writer import (  # noqa: F401
    test_concurrent_writers_of_one_generation_apply_each_record_once,
    test_partial_overlap_applies_only_the_new_tail,
    test_reader_follows_the_alias_flip,
    test_state_equals_the_oracle_and_replaying_changes_nothing,
)
from tests.integration.test_rekeyed_writer import (  # noqa: F401
    orders,
    test_slots_fold_again_what_redis_lost,
    test_slots_in_any_chunking_and_order_equal_the_oracle,
)
from tests.integration.test_replay_admin import (  # noqa: F401
    test_diff_finds_a_changed_key,
    test_rollback_flips_back_and_gc_removes_the_retired_generation,
    two_generations,
)
from tests.integration.test_replay_execution import (  # noqa: F401
    test_a_seeded_plan_starts_at_the_snapshot_and_rebuilds_the_same_state,
    test_a_snapshot_taken_while_batches_commit_is_consistent,
    test_in_place_reset_of_a_re_keyed_generation_moves_every_slot,
    world,
)
from tests.integration.test_serving import (  # noqa: F401
    stack,
    test_ingest_then_query_with_the_token_sees_the_write,
    test_pagination_is_complete_without_duplicates_while_a_flip_happens,
)
from tests.integration.test_sharded_admin import (  # noqa: F401
    sharded_orders,
    test_a_snapshot_copies_each_shard_in_its_slot_and_seeds_the_same_shards,
    test_diff_compares_sharded_generations_by_key_and_aggregates_by_their_sum,
    test_gc_removes_every_key_of_a_sharded_generation,
    test_in_place_reset_empties_every_shard_and_restores_a_snapshot_by_shard,
    test_sharded_snapshots_taken_while_batches_commit_are_consistent_per_shard,
)
from tests.integration.test_sharded_serving import (  # noqa: F401
    sharded_stack,
    test_a_token_of_other_partitions_is_read_from_their_shards_and_aggregates_add_up,
    test_monitor_metrics_and_dlq_list_gather_the_shards,
    test_pages_over_the_shards_are_complete_without_duplicates_while_a_flip_happens,
    test_the_watermark_gathers_every_shards_clocks,
)
from tests.integration.test_sharded_windows import (  # noqa: F401
    test_sharded_windows_read_as_the_oracle_and_as_one_slot,
    test_snapshots_diff_reset_and_gc_take_every_shard_of_a_window_processor,
    test_the_closer_emits_each_window_once_merged_over_the_shards_as_one_slot_would,
)
from tests.integration.test_sharded_writer import (  # noqa: F401
    sharded,
    test_a_bad_record_is_dead_lettered_and_indexed_in_its_shard,
    test_a_sharded_generation_equals_the_oracle_and_replaying_changes_nothing,
    test_each_shards_keys_are_in_its_own_slot,
)
from tests.integration.test_state_kinds_lifecycle import (  # noqa: F401
    test_snapshot_seed_diff_reset_and_gc_cover_every_state_kind,
)
from tests.integration.test_window_writer import (  # noqa: F401
    test_after_a_flip_the_new_generation_emits_only_the_windows_the_old_one_did_not,
    test_buckets_equal_the_oracle_whatever_the_chunks_and_interleaving,
)
from tests.support import redis_cluster as cluster_fixtures
from tests.support.topics import publish, source_records

P = OrderStateProjection()
# This module's Redis is a local cluster (tests/support/redis_cluster.py).
redis_cluster = cluster_fixtures.redis_cluster
redis_url = cluster_fixtures.redis_url


def test_the_cluster_spreads_processors_and_keeps_each_flip_in_one_slot(redis_url, unique):
    cluster_client = redis_client(redis_url)
    slots = {}
    for name in ("order_state", "customer_stats", "sales_windows", "order_alerts"):
        registry = GenerationRegistry.of(cluster_client, name, f"test-{unique}")
        generation = registry.create({"topics": ["orders"]}, live=True)
        nodes = {
            cluster_client.get_node_from_key(key).name
            for key in (registry.layout.alias, registry.layout.generations, registry.layout.flips)
        }
        assert len(nodes) == 1  # the registry's keys: one slot
        second = registry.create({"topics": ["orders"]})
        assert registry.flip(second) == generation
        assert registry.meta(second)["replaced"] == str(generation)
        slots[name] = cluster_client.keyslot(registry.keys(second).positions)
    assert len(set(slots.values())) == len(slots)  # each generation its own slot


@pytest.mark.parametrize("shards", [0, 4], ids=["one-slot", "sharded"])
def test_a_master_killed_under_traffic_fails_over_and_nothing_is_lost_or_applied_twice(
    redis_cluster, target, kafka_bootstrap, make_topic, shards
):
    topic = make_topic(partitions=4, prefix="orders")
    events = list(OrderSimulator(1500, seed=17, anomaly_rate=0))
    publish(kafka_bootstrap, dataclasses.replace(ORDERS, partitions=4), topic, events)
    records, _ends = source_records(kafka_bootstrap, topic, 4)
    chunks = [records[i : i + 60] for i in range(0, len(records), 60)]
    cluster_client = redis_client(target.redis_url)
    registry = GenerationRegistry(cluster_client, target.layout)
    assert registry.create({SHARDS_FIELD: shards}, live=True) == target.generation
    target = dataclasses.replace(target, shards=shards)
    # Sharded: the master of partition id 0's shard (it holds one or two of the four).
    master = cluster_client.get_node_from_key(target.keys.for_shard(0).positions).port
    writer = FoldWriter(target, P)
    applied_at: list[float] = []
    killed_at: list[float] = []
    errors: list[BaseException] = []

    def traffic() -> None:
        try:
            for batch_id, chunk in enumerate(chunks):
                writer.apply(chunk, batch_id=batch_id)
                applied_at.append(time.monotonic())
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=traffic)
    thread.start()
    while len(applied_at) < len(chunks) // 3 and thread.is_alive():
        time.sleep(0.01)
    redis_cluster.kill(master)
    killed_at.append(time.monotonic())
    thread.join(timeout=180)
    assert not thread.is_alive()
    assert errors == []
    after = [t for t in applied_at if t > killed_at[0]]
    assert after, "no batch was applied after the failover"
    print(f"failover: batches applied again {after[0] - killed_at[0]:.1f} s after the kill")
    assert master not in redis_cluster.masters_now()  # its replica took over

    expected = fold_all(P, events)
    reader = StateReader.from_url(target.redis_url, "order_state", target.key_prefix)
    assert dict(reader.scan("orders", generation=1)) == expected.states
    assert reader.aggregate("order_totals", generation=1).value == dict(expected.aggregate)
    # The old master comes back as a replica of the new one; the cluster is whole again.
    redis_cluster.restart(master)
    redis_cluster.wait_ok()
