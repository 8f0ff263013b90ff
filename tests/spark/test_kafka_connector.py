"""Spark's own Kafka source (``source_format = "kafka"``) against refold's source, same log.

Both fold order_state into generations that equal each other and the oracle; with the JVM
source, Redis positions stay authoritative (a Redis restored from an older snapshot is refolded
from its positions, not from the checkpoint), and a replay from a timestamp (seeded by a
snapshot) equals the oracle.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from refold.contracts.processors import ProcessLauncher
from refold.contracts.registry import processor_spec
from refold.contracts.settings import KafkaSettings, SparkSettings
from refold.contracts.store.generations import GenerationRegistry
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.errors import ProcessorConfigError
from refold.processors.order_state.config import OrderStateOptions
from refold.processors.runtime.spark import check_kafka_connector
from refold.replay.plan import ToDatetime
from refold.replay.rebuild import plan_replay, run_rebuild
from refold.replay.snapshots import SnapshotStore
from refold.services.producer.publisher import EventPublisher

from .conftest import oracle


def _snapshot(client, prefix: str) -> dict[bytes, bytes]:
    return {key: client.dump(key) for key in client.scan_iter(match=f"{prefix}*", count=1000)}


def _restore(client, prefix: str, snapshot: dict[bytes, bytes]) -> None:
    """Put Redis back as it was at ``snapshot`` (as if restarted from an older RDB file)."""
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        client.unlink(key)
    for key, value in snapshot.items():
        client.restore(key, 0, value)


def test_the_kafka_source_equals_refolds_source_through_an_older_redis_and_a_timed_replay(
    spark, world
):
    events = list(OrderSimulator(1800, seed=23))
    first, second, third = events[:6000], events[6000:12000], events[12000:]
    assert third
    publisher = world.publisher()
    prefix = world.redis.key_prefix

    publisher.emit_many(first)
    live = world.run_available_now(spark, source_format="kafka")
    assert world.state(live)[0] == oracle(first).states
    older = _snapshot(world.client, prefix)
    publisher.emit_many(second)
    assert world.run_available_now(spark, source_format="kafka") == live
    assert world.state(live)[0] == oracle(first + second).states

    # Redis goes back to before `second`; the checkpoint does not. The positions in Redis win:
    # the sink reads `second` again (the gap) although no new record arrived.
    _restore(world.client, prefix, older)
    assert world.run_available_now(spark, source_format="kafka") == live
    assert world.state(live) == (
        oracle(first + second).states,
        dict(oracle(first + second).aggregate),
    )

    SnapshotStore(GenerationRegistry.of(world.client, "order_state", prefix)).take(
        live
    )  # what a replay from a time starts from
    time.sleep(1.1)  # record timestamps are milliseconds: `third` starts strictly later
    third_from = datetime.now(UTC)
    time.sleep(0.1)
    publisher.emit_many(third)
    assert world.run_available_now(spark, source_format="kafka") == live
    expected = (oracle(events).states, dict(oracle(events).aggregate))
    assert world.state(live) == expected

    # A replay from a timestamp with the JVM source: the snapshot, then the records from then on.
    options = OrderStateOptions(
        topics=[world.topic.name],
        dead_letter_topic=world.dlq,
        notifications_topic=f"{world.topic.name}.notifications",
        source_format="kafka",
    )
    launcher = ProcessLauncher(
        world.kafka, world.redis, SparkSettings(), world.state_dir, {"order_state": options}
    )
    spec = processor_spec("order_state")
    plan = plan_replay(spec, ToDatetime(third_from), world.kafka, world.client, prefix)
    assert plan.total_events == len(third)
    result = run_rebuild(
        plan, spec, world.kafka, world.redis, state_dir=world.state_dir, launcher=launcher
    )
    assert world.state(result.generation) == expected

    # refold's own source, from earliest into a new generation: the same state.
    ranges = world.run_available_now(spark, generation="new", source_format="refold_kafka_ranges")
    assert ranges not in (live, result.generation)
    assert world.state(ranges) == expected


def test_aborted_records_are_never_folded_and_a_batch_of_markers_moves_the_positions(spark, world):
    events = list(OrderSimulator(300, seed=31))
    half = len(events) // 2
    world.publisher().emit_many(events[:half])

    def transactional(name: str) -> EventPublisher:
        publisher = EventPublisher(
            KafkaSettings(
                bootstrap_servers=world.kafka.bootstrap_servers,
                client_properties={
                    "transactional.id": f"{world.topic.name}-{name}",
                    # The publisher's message.timeout.ms is longer than the 60 s default.
                    "transaction.timeout.ms": "600000",
                },
            ),
            topics=[world.topic],
        )
        publisher.producer.init_transactions(30)
        publisher.producer.begin_transaction()
        return publisher

    committed = transactional("committed")
    committed.emit_many(events[half:])
    committed.producer.commit_transaction(30)
    committed.close()
    live = world.run_available_now(spark, source_format="kafka")
    assert world.state(live)[0] == oracle(events).states

    # Records of an aborted transaction (orders of the same ids: folded, they would change the
    # states) and its markers: the source reads read_committed, so the next batch holds no
    # record, and the driver closes its ranges at the log end.
    aborted = transactional("aborted")
    aborted.emit_many(list(OrderSimulator(100, seed=32)))
    aborted.producer.abort_transaction(30)
    aborted.close()
    assert world.run_available_now(spark, source_format="kafka") == live
    offsets = world.offsets()
    ends = offsets.end_offsets([(world.topic.name, p) for p in range(world.topic.partitions)])
    offsets.close()
    assert world.reader().freshness() == ends
    assert world.state(live) == (oracle(events).states, dict(oracle(events).aggregate))


def test_a_missing_or_mismatched_connector_is_refused_with_what_to_do(tmp_path):
    with pytest.raises(ProcessorConfigError, match="make setup"):
        check_kafka_connector(SparkSettings(jars_dir=tmp_path))
    (tmp_path / "spark-sql-kafka-0-10_2.13-3.5.0.jar").write_bytes(b"")
    with pytest.raises(ProcessorConfigError, match=r"3\.5\.0, but PySpark is"):
        check_kafka_connector(SparkSettings(jars_dir=tmp_path))
    check_kafka_connector(SparkSettings())  # the folder make setup filled passes
