"""order_state on a real Redis Cluster, its generations sharded by partition id.

This module's ``redis_url`` is a local cluster's (3 masters with 1 replica each, as `refold
up --redis-cluster`), so the order_state scenarios imported below run here a second time:
Spark folds, dead letters and stats, three kill -9s of the processor, and an online replay
that readers follow through the flip. On a cluster a new generation of a co-partitioned
entity fold is sharded (``RedisSettings.shard_state`` ``auto``): each partition id's
transactions write under the shard's own hash tag, on the master that owns it.
"""

from __future__ import annotations

from refold.contracts.store.generations import SHARDS_FIELD, GenerationRegistry
from refold.deploy.simulators.orders import OrderSimulator
from tests.spark.test_order_state_e2e import (  # noqa: F401 - run here on the cluster
    test_processor_survives_kill_9_three_times_and_ends_exactly_at_the_oracle,
    test_replay_rebuilds_a_new_generation_while_readers_stay_on_the_old_one,
    test_undecodable_records_go_to_the_dead_letter_topic_and_the_stream_goes_on,
)
from tests.support import redis_cluster as cluster_fixtures

from .conftest import oracle

# This module's Redis is a local cluster (tests/support/redis_cluster.py).
redis_cluster = cluster_fixtures.redis_cluster
redis_url = cluster_fixtures.redis_url


def test_a_generation_on_the_cluster_is_sharded_over_every_master(spark, world):
    events = list(OrderSimulator(600, seed=12))
    world.publisher().emit_many(events)
    generation = world.run_available_now(spark)
    registry = GenerationRegistry.of(world.client, "order_state", world.redis.key_prefix)
    assert registry.meta(generation)[SHARDS_FIELD] == str(world.topic.partitions)
    keys = registry.keys(generation)
    owners = {world.client.get_node_from_key(k.positions).name for k in keys.each_shard()}
    assert len(owners) == 3  # 8 partition ids over 3 masters
    states, totals = world.state(generation)
    assert states == oracle(events).states
    assert totals == dict(oracle(events).aggregate)
    # Nothing of the fold under the generation's own tag: only its meta and lease.
    assert list(world.client.scan_iter(match=f"{keys.home}:t:*")) == []
