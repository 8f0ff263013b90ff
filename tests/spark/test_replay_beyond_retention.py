"""Replay beyond retention: the archive serves what the log deleted (DESIGN.md 20, issue 45).

The archive, order_state (entities), sales_windows (event-time windows, late payments
dead-lettered) and order_alerts (patterns: absences and sequences on event-time deadlines) run
as one Spark application over an orders topic until each has applied the whole log: generation
1 of each is built from the untruncated log. Then retention deletes the first 60% of every
partition (``delete_records``), and each processor is rebuilt from all of history: the archive
up to each partition's log start, then the log.

- order_state and sales_windows: ``replay --to-earliest --execute`` builds generation 2 and
  flips to it.
- order_alerts: the same replay, whose processor (driver, JVM and workers) is killed with
  SIGKILL while it reads the archive; resumed (``refold process order_alerts --generation 2``,
  from its checkpoint), it is killed again while the batch that crosses the log start (the
  archive's last records, then Kafka's first) is planned and not committed; resumed again, it
  runs to the log end.

Each generation 2 equals its generation 1 (every entity, aggregate, window bucket and distinct
sketch) and its plain-Python oracle over every event of the untruncated log.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from refold.contracts.commerce import ORDERS
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.layout import parse_position_field, position_field
from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessLauncher, ProcessorOptions
from refold.contracts.registry import processor_spec
from refold.contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.web import CUSTOMERS, PAGEVIEWS, SEARCHES
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.archive.config import ArchiveOptions
from refold.processors.fold.oracle import fold_all, fold_timed, fold_windows
from refold.processors.fold.patterns import PatternOptions
from refold.processors.order_alerts.config import ORDER_ALERTS
from refold.processors.order_alerts.projection import build as build_order_alerts
from refold.processors.order_state.config import OrderStateOptions
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.checkpoints import checkpoint_location, checkpoint_root
from refold.processors.runtime.offset_log import batch_end_offsets
from refold.processors.sales_windows.config import SALES_WINDOWS
from refold.processors.sales_windows.projection import SalesWindows
from refold.replay.generations_admin import diff_generations
from refold.services.producer.publisher import EventPublisher
from refold.services.reader.state_reader import StateReader
from tests.support.waiting import assert_eventually
from tests.support.windows import bucket_dump, log_events

PARTITIONS = ORDERS.partitions  # the spec checks the topic has as many
REPLAYED = ("order_state", "sales_windows")
KILLED = "order_alerts"  # rebuilt through two kill -9s
Positions = dict[tuple[str, int], int]


def _with_late_payments(events: list, every: int = 40, by: int = 2_000) -> list:
    """``events`` with every ``every``-th payment of the first half delivered ``by`` events later.

    The simulator ticks one clock, so its log has no disorder; a payment that arrives ~2,000
    events (minutes of event time) after its time is late for sales_windows (30 s of lateness)
    and order_alerts (60 s) alike.
    """
    paid = [i for i, (kind, _e) in enumerate(events[: len(events) // 2]) if kind == "OrderPaid"]
    arrives = {i + by: i for i in paid[::every]}  # where each moved payment is delivered
    out: list = []
    for i, event in enumerate(events):
        if i not in arrives.values():
            out.append(event)
        if i in arrives:
            out.append(events[arrives[i]])
    return out


@pytest.mark.timeout(900)
def test_a_rebuild_from_all_of_history_reads_the_archive_below_the_log_start(
    kafka_bootstrap, redis_url, make_topic, unique, tmp_path: Path
):
    topic = make_topic(partitions=PARTITIONS, prefix="orders")
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    prefix = f"test-{unique}"
    batch = 2_000  # several micro-batches, so the archive covers many ranges
    alerts = PatternOptions(
        topics=[topic],
        dead_letter_topic=make_topic(partitions=1, prefix="dlq"),
        insights_topic=make_topic(partitions=1, prefix="insights"),
        max_offsets_per_trigger=batch,
    )
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
            KILLED: alerts,
        },
    )
    events = _with_late_payments(list(OrderSimulator(1_200, seed=45)))
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
    # The oracles' input: every record of the untruncated log, in log order per partition.
    records = list(log_events(kafka_bootstrap, topic))
    client = redis_client(redis_url)
    registries = {
        name: GenerationRegistry.of(client, name, prefix) for name in ("archive", *REPLAYED, KILLED)
    }

    def caught_up() -> bool:
        return all(
            r.live() == 1
            and {tp: o for tp, o in r.positions(1)[0].items() if tp[0] == topic} == end
            for r in registries.values()
        )

    app = GroupProcess(
        launcher.argv(["archive", *REPLAYED, KILLED]), launcher.env(), tmp_path / "live.log"
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
    for name in REPLAYED:
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
    _rebuild_killed_twice(launcher, registries[KILLED], cut, end, tmp_path)

    for name in (*REPLAYED, KILLED):
        diff = diff_generations(processor_spec(name), client, prefix, 1, 2)
        assert diff.identical, (name, diff.render())
        assert diff.compared + diff.buckets_compared > 0
    # Each generation 2 == its oracle over every event of the untruncated log.
    orders = fold_all(OrderStateProjection(), events)
    reader = StateReader(client, "order_state", prefix)
    assert dict(reader.scan("orders", 2)) == orders.states
    assert reader.aggregate("order_totals", 2).value == dict(orders.aggregate)
    windows = fold_windows(SalesWindows(), SALES_WINDOWS.event_time, records)
    assert windows.late, "some payments were late"
    assert bucket_dump(client, registries["sales_windows"].keys(2)) == windows.buckets
    timed = [
        (*parse_position_field(field), offset, kind, event)
        for field, offset, kind, event in records
    ]
    patterns = fold_timed(build_order_alerts(alerts), ORDER_ALERTS.event_time, (topic,), timed)
    assert patterns.effects, "the patterns matched"
    alerts_reader = StateReader(client, KILLED, prefix)
    assert dict(alerts_reader.scan("patterns", 2)) == patterns.states
    assert alerts_reader.aggregate("insight_counts", 2).value == dict(patterns.aggregate)


def _rebuild_killed_twice(
    launcher: ProcessLauncher,
    registry: GenerationRegistry,
    cut: Positions,
    end: Positions,
    state_dir: Path,
) -> None:
    """``replay --to-earliest --execute`` of the killed processor into g2, through two kill -9s.

    Kill 1: once the rebuild has committed its first batch, all of it below the log starts
    (the next batch reads the archive only). Kill 2: once the batch that crosses the log starts
    is planned (Spark wrote it to the checkpoint's offsets log) and its positions are not
    committed. Each resumed run re-runs the planned batch from the checkpoint.
    """
    generation = 2
    command = ["--no-progress", "--processor", KILLED, "--to-earliest", "--execute"]
    replay = GroupProcess(
        [sys.executable, "-m", "refold.replay", *command],
        launcher.env(),
        state_dir / "replay-killed.log",
    ).start()

    def applied() -> Positions:
        return registry.positions(generation)[0]

    assert_eventually(
        lambda: sum(applied().values()) > 0,
        timeout=240,
        alive=replay.alive,
        message=replay.log_tail,
    )
    owner = registry.lease_owner(generation)  # host:pid:nonce of the rebuild's driver
    assert owner is not None
    os.killpg(os.getpgid(int(owner.rsplit(":", 2)[1])), signal.SIGKILL)
    assert replay.wait(120) != 0  # it says its processor died; g2 is left building
    assert f"the processor building g{generation} exited" in replay.log_tail(60)
    after_first = applied()
    assert all(after_first[tp] < cut[tp] for tp in cut), (after_first, cut)  # in the archive

    checkpoint = checkpoint_location(
        checkpoint_root(state_dir, launcher.spark, key_prefix=launcher.redis.key_prefix),
        KILLED,
        generation,
    )

    def crossing_planned() -> bool:
        """The newest planned batch ends past a log start that no committed position passed."""
        planned = sorted(int(n) for n in os.listdir(f"{checkpoint}/offsets") if n.isdigit())
        ends = batch_end_offsets(checkpoint, planned[-1])
        now = applied()
        return any(
            ends.get(position_field(*tp), 0) > c and now.get(tp, 0) < c for tp, c in cut.items()
        )

    resumed = launcher.argv([KILLED], generation=generation)
    second = GroupProcess(resumed, launcher.env(), state_dir / "resumed-1.log").start()
    try:
        assert_eventually(
            crossing_planned,
            timeout=240,
            interval=0.02,
            alive=second.alive,
            message=second.log_tail,
        )
        second.kill()  # kill -9 at the switch from the archive to Kafka
    finally:
        second.stop()
    assert f"resuming from checkpoint {checkpoint}" in (state_dir / "resumed-1.log").read_text()
    after_second = applied()
    assert any(after_second[tp] < cut[tp] for tp in cut), (after_second, cut)

    third = GroupProcess(
        [*resumed, "--available-now"], launcher.env(), state_dir / "resumed-2.log"
    ).start()
    try:
        assert third.wait(300) == 0, third.log_tail()
    finally:
        third.stop()
    assert applied() == end
    assert registry.live() == 1  # resumed by hand: nothing flipped
