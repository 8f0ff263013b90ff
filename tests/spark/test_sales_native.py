"""A DataFrame processor on real Spark: sales_native through a kill -9 and a replay.

Its rows equal sales_windows' ``per_minute`` windows computed by the plain-Python oracle for
every window Spark has finalized, its positions in Redis are the log end once caught up (what
replay's catch-up check reads), and ``replay --to-earliest`` with other batch sizes builds an
identical table in a new generation.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from refold.contracts.commerce import ORDERS
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessLauncher, ProcessorOptions
from refold.contracts.registry import processor_spec
from refold.contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import fold_windows
from refold.processors.sales_windows.config import SALES_WINDOWS
from refold.processors.sales_windows.projection import SalesWindows
from refold.replay.plan import ToEarliest
from refold.replay.rebuild import plan_replay, run_rebuild
from refold.services.producer.publisher import EventPublisher
from refold.services.reader.state_reader import StateReader
from tests.support.waiting import assert_eventually
from tests.support.windows import log_events

NAME = "sales_native"
DELAY_MS = 30_000  # SalesNative.watermark_delay


def _log_end(kafka: KafkaSettings, topic: str) -> dict[tuple[str, int], int]:
    offsets = LogOffsets(kafka.as_librdkafka())
    try:
        return offsets.end_offsets([(topic, p) for p in offsets.partitions(topic)])
    finally:
        offsets.close()


def test_sales_native_equals_the_window_oracle_through_a_kill_and_a_replay(
    kafka_bootstrap, redis_url, make_topic, unique, tmp_path: Path
):
    orders = make_topic(partitions=ORDERS.partitions, prefix="orders")
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    redis_settings = RedisSettings(url=redis_url, key_prefix=f"test-{unique}")

    def launcher(batch: int) -> ProcessLauncher:
        options = ProcessorOptions(
            topics=[orders],
            dead_letter_topic=make_topic(partitions=1, prefix="dlq"),
            max_offsets_per_trigger=batch,  # several micro-batches, crash points between
        )
        return ProcessLauncher(kafka, redis_settings, SparkSettings(), tmp_path, {NAME: options})

    live = launcher(1_500)
    publisher = EventPublisher(kafka, topics=[dataclasses.replace(ORDERS, name=orders)])
    events = list(OrderSimulator(1_500, seed=21))
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, NAME, redis_settings.key_prefix)

    def applied_batch() -> int | None:
        generation = registry.live()
        return None if generation is None else registry.positions(generation)[1]

    half = len(events) // 2
    publisher.emit_many(events[:half])
    process = GroupProcess(live.argv([NAME]), live.env(), tmp_path / "run-1.log").start()
    processes = [process]
    try:
        assert_eventually(
            lambda: applied_batch() is not None,
            timeout=240,
            alive=process.alive,
            message=process.log_tail,
        )
        publisher.emit_many(events[half:])
        process.kill()  # kill -9 with records still to aggregate
        process = GroupProcess(live.argv([NAME]), live.env(), tmp_path / "run-2.log").start()
        processes.append(process)
        end = _log_end(kafka, orders)
        first = registry.live()
        assert first is not None
        # Caught up: the generation's positions are the log end, as replay's check reads them.
        assert_eventually(
            lambda: registry.positions(first)[0] == end,
            timeout=240,
            alive=process.alive,
            message=process.log_tail,
        )
        oracle = fold_windows(
            SalesWindows(), SALES_WINDOWS.event_time, log_events(kafka_bootstrap, orders)
        )
        rows = dict(StateReader(client, NAME, redis_settings.key_prefix).scan("per_minute"))
        # Which windows Spark has finalized: its watermark is one global value, the newest
        # paid_at of every batch so far minus the delay, moved at the end of each batch; a
        # window whose end is at or below it gets no more records (Spark drops them). refold
        # judges lateness per partition in log order instead (the oracle), so the two could
        # disagree about a record that is late by one rule and not the other. The simulated
        # payments are late by neither: each partition's paid_at only grows (the oracle finds
        # no late record) and every batch advances all partitions in proportion to their
        # backlog, far less than 30 s apart. So every window both have must agree exactly;
        # windows past the watermark are still open in Spark and not compared.
        assert not oracle.late
        paid = [
            e["paid_at"]
            for _f, _o, kind, e in log_events(kafka_bootstrap, orders)
            if kind == "OrderPaid"
        ]
        watermark = max(paid) - DELAY_MS
        per_minute = SalesWindows().windows[0]
        finalized = {k: r for k, r in rows.items() if r["end"] <= watermark}
        expected = {
            f"{group}:{start}"
            for (window, start, group) in oracle.buckets
            if window == per_minute.name and start + per_minute.size_ms <= watermark
        }
        assert set(finalized) == expected
        assert len(expected) > 100
        for key, row in finalized.items():
            want = oracle.window(per_minute, row["end"], row["group"])
            assert row == {k: v for k, v in want.items() if not k.startswith("distinct:")}, key
        assert len(paid) == sum(1 for kind, _e in events if kind == "OrderPaid")

        # replay --to-earliest, other batch sizes: an identical table in a new generation.
        process.stop()
        spec = processor_spec(NAME)
        plan = plan_replay(spec, ToEarliest(), kafka, client, redis_settings.key_prefix)
        assert plan.ready, plan.render()
        rebuilt = run_rebuild(
            plan, spec, kafka, redis_settings, state_dir=tmp_path, launcher=launcher(4_000)
        )
        assert rebuilt.previous == first
        assert registry.live() == rebuilt.generation != first
        reader = StateReader(client, NAME, redis_settings.key_prefix)
        assert dict(reader.scan("per_minute", rebuilt.generation)) == rows
        assert registry.positions(rebuilt.generation)[0] == end
    finally:
        for running in processes:
            running.stop()
        publisher.close()
