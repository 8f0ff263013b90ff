"""A partition leader killed under traffic, on a real three-node Kafka cluster.

This module's Kafka is a local cluster (three KRaft nodes, each broker and controller, as
``refold up --kafka-nodes 3``), started once for the module; the rest of the suite keeps its
one broker. Topics get three replicas and ``min.insync.replicas=2``. While the producer SDK
writes orders at a steady rate (acks=all, idempotent) and order_state folds them in one Spark
application, the node that leads the busiest partition is killed with SIGKILL. Then: every
acknowledged event is in the log where its token says, no event is in it twice, and the
processor's state equals the plain-Python oracle over all of them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient

from refold.contracts.codec import EventCodec
from refold.deploy.demo import wait_until_caught_up
from refold.deploy.kafka_cluster import LocalKafkaCluster, under_replicated
from refold.deploy.redis_cluster import free_port_run
from refold.deploy.simulators.orders import OrderSimulator
from refold.services.producer.publisher import DeliveryToken
from tests.support.topics import read_to_end

from .conftest import OrdersWorld, oracle

_CHUNK, _EVERY_S = 60, 0.1  # ~600 events/s, steady


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafkaCluster]:
    home = tmp_path_factory.mktemp("kafka-cluster")
    with LocalKafkaCluster(home, free_port_run(6)) as cluster:
        yield cluster
        # Thrown away: the nodes left are killed, not stopped (a controlled shutdown would
        # move their leaders first, for nothing).
        for node_id in cluster.node_ids:
            cluster.kill(node_id)


@pytest.fixture(scope="module")
def kafka_bootstrap(kafka_cluster: LocalKafkaCluster) -> str:
    """Every fixture of the module (topics, the world, the processor) reaches the cluster."""
    return kafka_cluster.bootstrap_servers


def _leader_of_busiest(world: OrdersWorld) -> tuple[int, int]:
    """(partition, leader node) of the partition with the most records now."""
    with world.offsets() as offsets:
        ends = offsets.end_offsets([(world.topic.name, p) for p in range(world.topic.partitions)])
    partition = max(ends, key=lambda tp: ends[tp])[1]
    metadata = AdminClient(world.kafka.as_librdkafka()).list_topics(world.topic.name, timeout=10)
    return partition, metadata.topics[world.topic.name].partitions[partition].leader


def test_a_partition_leader_killed_under_traffic_loses_and_doubles_nothing(kafka_cluster, world):
    events = list(OrderSimulator(700, seed=49))
    head, rest = events[:1000], events[1000:]
    publisher = world.publisher()
    acknowledged: list[tuple[dict, DeliveryToken]] = []
    acknowledged += zip((e for _, e in head), publisher.emit_many(head), strict=True)
    process = world.processor(name="failover").start()
    try:
        deadline = time.monotonic() + 120
        while world.applied() == 0:  # the application runs and has folded a batch
            assert process.alive(), process.log_tail()
            assert time.monotonic() < deadline, "processor made no progress"
            time.sleep(0.2)

        acks_at: list[float] = []
        failures: list[BaseException] = []

        def produce() -> None:
            try:
                for i in range(0, len(rest), _CHUNK):
                    chunk = rest[i : i + _CHUNK]
                    tokens = publisher.emit_many(chunk, timeout=60)
                    acknowledged.extend(zip((e for _, e in chunk), tokens, strict=True))
                    acks_at.append(time.monotonic())
                    time.sleep(_EVERY_S)
            except BaseException as exc:
                failures.append(exc)

        writer = threading.Thread(target=produce)
        writer.start()
        time.sleep(1.5)  # traffic flows
        partition, leader = _leader_of_busiest(world)
        applied_before = world.applied()
        killed_at = time.monotonic()
        kafka_cluster.kill(leader)
        writer.join(timeout=300)
        assert not writer.is_alive()
        assert failures == []
        # Producing went on: the first acknowledgement after the kill.
        resumed = min(t for t in acks_at if t > killed_at) - killed_at
        print(  # the recovery, in the test's output
            f"killed node {leader}, leader of partition {partition}; first acknowledgement "
            f"{resumed:.1f} s after, {len(acknowledged)} events acknowledged"
        )
        # Every acknowledged event is in the log where its token says, and none twice.
        codec = EventCodec()
        log = {
            (m.partition(), m.offset()): codec.decode(m.value()).data["event_id"]
            for m in read_to_end(world.kafka.bootstrap_servers, world.topic.name)
        }
        assert len(set(log.values())) == len(log)
        assert len(acknowledged) == len(events)
        for event, token in acknowledged:
            assert log[(token.partition, token.offset)] == event["event_id"]
        assert sorted(log.values()) == sorted(e["event_id"] for _, e in events)
        # The killed node's partitions kept two in-sync replicas: still writable (min ISR 2).
        lagging = under_replicated(kafka_cluster.bootstrap_servers)
        assert all(len(p.isr) >= 2 for p in lagging if p.topic == world.topic.name)
        # The processor folds the rest, each record once: its state is the oracle's. It kept
        # up through the kill (its log-end reads wait out the leader's move, not 30 s a batch):
        # caught up within seconds of the last acknowledgement.
        with world.offsets() as offsets:
            wait_until_caught_up(
                world.reader(), offsets, [world.topic.name], timeout=60, alive=process.alive
            )
        assert world.applied() > applied_before
        print(
            f"the processor had caught up {time.monotonic() - killed_at:.1f} s after the kill, "
            f"{time.monotonic() - acks_at[-1]:.1f} s after the last acknowledgement"
        )
    finally:
        process.stop()
    expected = oracle(events)
    states, totals = world.state()
    assert states == expected.states
    assert totals == dict(expected.aggregate)
