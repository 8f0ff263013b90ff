"""A fold from offset 0 on a tiered broker reads the remote tier and equals the oracle (issue 45).

The broker of a private stack tiers (``refold up --tiered-storage``: Kafka's LocalTieredStorage);
the orders topic, one partition of 1 MiB segments with a local retention of one second, is
created by refold, so tiered. Once its first segments have left the broker's disk, order_state
builds its first generation from the earliest offset, 0, in Spark: its tasks read the remote
segments through refold's Kafka source, and the state equals the plain-Python oracle over every
event.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from refold.contracts.commerce import ORDERS
from refold.contracts.kafka.admin import ensure_topics
from refold.contracts.processors import ProcessLauncher
from refold.contracts.settings import SparkSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.topics import dead_letter_spec
from refold.deploy.local_stack import LocalStack, free_port
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.order_state.config import OrderStateOptions

from .conftest import OrdersWorld, oracle

_TIERED = (("segment.bytes", "1048576"), ("local.retention.ms", "1000"))


@pytest.fixture
def tiered_world(tmp_path: Path) -> Iterator[tuple[OrdersWorld, LocalStack]]:
    stack = LocalStack(
        tmp_path / "stack", free_port(), free_port(), redis_persistent=False, tiered_storage=True
    )
    with stack:  # stops both servers by their recorded pids, whatever the test did
        topic = dataclasses.replace(ORDERS, name="orders", partitions=1, config=_TIERED)
        dlq = dead_letter_spec("order_state")
        kafka, redis_settings = stack.kafka_settings(), stack.redis_settings("test-tiered")
        ensure_topics(kafka.as_librdkafka(), [topic, dlq])
        options = OrderStateOptions(
            topics=[topic.name],
            dead_letter_topic=dlq.name,
            notifications_topic="orders.notifications",
        )
        launcher = ProcessLauncher(
            kafka, redis_settings, SparkSettings(), tmp_path, {"order_state": options}
        )
        client = redis_client(stack.redis_url)
        world = OrdersWorld(topic, dlq.name, kafka, redis_settings, tmp_path, launcher, client)
        yield world, stack


def _local_log_start(stack: LocalStack, topic: str) -> int:
    segments = (stack.state_dir / "kafka" / "data" / f"{topic}-0").glob("*.log")
    return min((int(f.stem) for f in segments), default=0)


def test_a_fold_from_offset_0_reads_the_remote_tier_and_equals_the_oracle(spark, tiered_world):
    world, stack = tiered_world
    events = list(OrderSimulator(3000, seed=45))
    world.publisher().emit_many(events)
    deadline = time.monotonic() + 45
    while _local_log_start(stack, world.topic.name) == 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    local_start = _local_log_start(stack, world.topic.name)
    assert local_start > 0, "no segment left the broker's disk"

    generation = world.run_available_now(spark)

    expected = oracle(events)
    states, totals = world.state(generation)
    assert states == expected.states
    assert totals == dict(expected.aggregate)
    with world.offsets() as offsets:
        tp = (world.topic.name, 0)
        assert offsets.start_offsets([tp]) == {tp: 0}
        assert world.reader().freshness() == offsets.end_offsets([tp])
