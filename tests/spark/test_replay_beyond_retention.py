"""Replay beyond retention: the archive serves what the log deleted (DESIGN.md 20, issue 45).

The archive, order_state (entities) and sales_windows (event-time windows, late payments
dead-lettered) run as one Spark application over an orders topic until each has applied the
whole log: generation 1 of each is built from the untruncated log. Then retention deletes the
first 60% of every partition (``delete_records``). ``replay --to-earliest --execute`` rebuilds
each processor into generation 2 from all of history: the archive up to each partition's log
start, then the log. Generation 2 equals generation 1 (every entity, aggregate, window bucket
and distinct sketch), and order_state equals the plain-Python oracle over every event.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from refold.contracts.commerce import ORDERS
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessLauncher, ProcessorOptions
from refold.contracts.registry import processor_spec
from refold.contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.web import CUSTOMERS, PAGEVIEWS, SEARCHES
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.archive.config import ArchiveOptions
from refold.processors.fold.oracle import fold_all
from refold.processors.order_state.config import OrderStateOptions
from refold.processors.order_state.projection import OrderStateProjection
from refold.replay.generations_admin import diff_generations
from refold.services.producer.publisher import EventPublisher
from refold.services.reader.state_reader import StateReader
from tests.support.waiting import assert_eventually

PARTITIONS = ORDERS.partitions  # the spec checks the topic has as many
REBUILT = ("order_state", "sales_windows")


@pytest.mark.timeout(900)
def test_a_rebuild_from_all_of_history_reads_the_archive_below_the_log_start(
    kafka_bootstrap, redis_url, make_topic, unique, tmp_path: Path
):
    topic = make_topic(partitions=PARTITIONS, prefix="orders")
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    prefix = f"test-{unique}"
    batch = 2_000  # several micro-batches, so the archive covers many ranges
    launcher = ProcessLauncher(
        kafka,
        RedisSettings(url=redis_url, key_prefix=prefix),
        SparkSettings(),
        tmp_path,  # REFOLD_STATE_DIR: the archive's default root is <state dir>/archive
        {
            "archive": ArchiveOptions(
                # It reads four topics (the reference ones); the orders one carries the events.
                topics=[
                    topic,
                    *(make_topic(s.partitions, "empty") for s in (PAGEVIEWS, SEARCHES, CUSTOMERS)),
                ],
                dead_letter_topic=make_topic(partitions=1, prefix="dlq"),
                root=tmp_path / "archive",
                max_offsets_per_trigger=batch,
            ),
            "order_state": OrderStateOptions(
                topics=[topic],
                dead_letter_topic=make_topic(partitions=1, prefix="dlq"),
                notifications_topic=f"{topic}.notifications",
                max_offsets_per_trigger=batch,
            ),
            "sales_windows": ProcessorOptions(
                topics=[topic],
                dead_letter_topic=make_topic(partitions=1, prefix="dlq"),
                windows_topic=make_topic(partitions=1, prefix="windows"),
                max_offsets_per_trigger=batch,
            ),
        },
    )
    events = list(OrderSimulator(1_200, seed=45))
    publisher = EventPublisher(
        kafka, topics=[dataclasses.replace(ORDERS, name=topic, partitions=PARTITIONS)]
    )
    publisher.emit_many(events)
    publisher.close()
    offsets = LogOffsets(kafka.as_librdkafka())
    try:
        end = offsets.end_offsets([(topic, p) for p in range(PARTITIONS)])
    finally:
        offsets.close()
    client = redis_client(redis_url)
    registries = {
        name: GenerationRegistry.of(client, name, prefix) for name in ("archive", *REBUILT)
    }

    def caught_up() -> bool:
        return all(
            r.live() == 1
            and {tp: o for tp, o in r.positions(1)[0].items() if tp[0] == topic} == end
            for r in registries.values()
        )

    app = GroupProcess(
        launcher.argv(["archive", *REBUILT]), launcher.env(), tmp_path / "live.log"
    ).start()
    try:
        assert_eventually(caught_up, timeout=420, alive=app.alive, message=app.log_tail)
    finally:
        app.stop()

    # Retention deletes the head of every partition.
    cut = {tp: int(offset * 0.6) for tp, offset in end.items()}
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    deleted = admin.delete_records([TopicPartition(t, p, o) for (t, p), o in cut.items()])
    for future in deleted.values():
        future.result(timeout=30)

    env = {**os.environ, **launcher.env()}
    for name in REBUILT:
        done = subprocess.run(  # the user's command
            [
                sys.executable,
                "-m",
                "refold.replay",
                "--processor",
                name,
                "--to-earliest",
                "--execute",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-4000:]
        assert "from the archive, then the log" in out, out[-4000:]
        assert registries[name].live() == 2, out[-4000:]
        assert registries[name].positions(2)[0] == end
        diff = diff_generations(processor_spec(name), client, prefix, 1, 2)
        assert diff.identical, diff.render()
        assert diff.compared + diff.buckets_compared > 0

    oracle = fold_all(OrderStateProjection(), events)
    reader = StateReader(client, "order_state", prefix)
    assert dict(reader.scan("orders", 2)) == oracle.states
    assert reader.aggregate("order_totals", 2).value == dict(oracle.aggregate)
