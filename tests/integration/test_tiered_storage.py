"""Kafka's tiered storage (KIP-405) on the local broker, tried for real (issue 45 item 4).

A private stack started with ``tiered_storage=True`` (``refold up --tiered-storage``): Kafka's
own LocalTieredStorage as the remote tier. refold creates a topic from its spec, tiered since
the broker has a remote tier, with 1 MiB segments and a local retention of one second: once its
first segments are copied to the remote tier and gone from the broker's disk, refold reads
every record from offset 0 unchanged, and the replay plan sees a log start of 0 (ListOffsets
EARLIEST counts remote segments); and again after the broker was stopped and started.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from refold.contracts.kafka.admin import ensure_topics
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.topics import TopicSpec
from refold.deploy.local_stack import LocalStack, free_port
from refold.processors.runtime.kafka_ranges import read_log
from refold.replay.plan import build_plan
from refold.replay.reset_specs import ToEarliest

_RECORDS = 3000
_SEGMENT_BYTES = 1_048_576  # Kafka 4's least: about 700 of these records a segment
_PADDING = "x" * 1400
_TIERED_WITHIN_S = 45.0


@pytest.fixture
def tiered_stack(tmp_path: Path) -> Iterator[LocalStack]:
    """A stack of this test alone, its broker tiering to ``<stack>/kafka/remote``."""
    stack = LocalStack(
        tmp_path / "stack", free_port(), free_port(), redis_persistent=False, tiered_storage=True
    )
    with stack:  # stops both servers by their recorded pids, whatever the test did
        yield stack


def _local_log_start(stack: LocalStack, topic: str) -> int:
    """The base offset of the partition's first segment still on the broker's disk."""
    segments = (stack.state_dir / "kafka" / "data" / f"{topic}-0").glob("*.log")
    return min((int(f.stem) for f in segments), default=0)


def test_a_read_from_offset_0_gets_records_that_left_the_brokers_disk(tiered_stack):
    kafka = {"bootstrap.servers": tiered_stack.bootstrap_servers}
    topic = "tiered-orders"
    config = (("segment.bytes", str(_SEGMENT_BYTES)), ("local.retention.ms", "1000"))
    spec = TopicSpec(topic, 1, "order_id", ("OrderPlaced",), config=config)
    assert ensure_topics(kafka, [spec]).created == (topic,)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    admin = AdminClient(kafka)  # kept: a dropped client fails its futures
    described = admin.describe_configs([resource])[resource].result(timeout=30)
    assert described["remote.storage.enable"].value == "true"  # the broker tiers: so does refold
    producer = Producer({**kafka, "acks": "all", "linger.ms": 20})
    sent = [f"{i}:{_PADDING}".encode() for i in range(_RECORDS)]
    for i, value in enumerate(sent):
        producer.produce(topic, value, key=str(i % 97).encode())
        producer.poll(0)
    assert producer.flush(30) == 0

    # The broker copies each closed segment to the remote tier, then deletes it locally.
    deadline = time.monotonic() + _TIERED_WITHIN_S
    while _local_log_start(tiered_stack, topic) == 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    local_start = _local_log_start(tiered_stack, topic)
    assert local_start > 0, "no segment left the broker's disk"
    assert tiered_stack.tiered is not None
    assert any(tiered_stack.tiered.root.rglob("*.log")), "nothing in the remote tier"

    tp = (topic, 0)
    with LogOffsets(kafka) as offsets:
        # EARLIEST is the log start with the remote segments: still 0.
        assert offsets.start_offsets([tp]) == {tp: 0}
        bounds = {tp: (0, offsets.end_offsets([tp])[tp])}
    assert bounds[tp][1] == _RECORDS
    plan = build_plan("tiered", ToEarliest(), bounds, {}, None)
    (row,) = plan.partitions
    assert (row.target, row.log_start, row.from_archive, row.lost) == (0, 0, 0, [])

    read = [m for chunk in read_log(kafka, topic) for m in chunk]
    assert [m.offset() for m in read] == list(range(_RECORDS))
    assert [m.value() for m in read] == sent
    # The first records were served from the remote tier: they are still not on local disk.
    assert _local_log_start(tiered_stack, topic) >= local_start

    # `refold down` and `refold up`: the remote tier and its metadata outlive the broker.
    tiered_stack.stop()
    tiered_stack.start()
    again = [m.value() for chunk in read_log(kafka, topic) for m in chunk]
    assert again == sent
