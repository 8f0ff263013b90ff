"""Fixtures for processor tests: a private orders topic, its env, reader and oracle."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from refold.contracts.commerce import ORDERS
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessLauncher
from refold.contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.topics import TopicSpec
from refold.deploy.demo import wait_until_caught_up
from refold.processors.fold.oracle import FoldResult, fold_all
from refold.processors.order_state.config import OrderStateOptions
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.checkpoints import checkpoint_root
from refold.processors.runtime.runner import RunOptions, run_processor
from refold.services.producer.publisher import EventPublisher
from refold.services.reader.state_reader import StateReader


@dataclass
class OrdersWorld:
    topic: TopicSpec
    dlq: str
    kafka: KafkaSettings
    redis: RedisSettings
    state_dir: Path
    launcher: ProcessLauncher
    client: redis.Redis

    @property
    def env(self) -> dict[str, str]:
        return self.launcher.env()

    def publisher(self) -> EventPublisher:
        return EventPublisher(self.kafka, topics=[self.topic])

    def reader(self) -> StateReader:
        return StateReader(self.client, "order_state", self.redis.key_prefix)

    def offsets(self) -> LogOffsets:
        return LogOffsets(self.kafka.as_librdkafka())

    def options(self, **changes) -> RunOptions:
        base = RunOptions(
            # Where `refold process` (the processes below) puts them: one folder of the root.
            checkpoint_root=checkpoint_root(
                self.state_dir, SparkSettings(), key_prefix=self.redis.key_prefix
            ),
            dead_letter_topic=self.dlq,
            max_offsets_per_trigger=20_000,
        )
        return dataclasses.replace(base, **changes)

    def run_available_now(self, spark, **changes) -> int:
        """Fold what is in the log now with order_state in ``spark``; the generation it ran."""
        options = self.options(available_now=True, **changes)
        return run_processor(
            OrderStateProjection(), [self.topic], self.kafka, self.redis, options, spark=spark
        )

    def processor(self, *args: str, name: str = "processor") -> GroupProcess:
        return GroupProcess(
            [*self.launcher.argv(["order_state"]), *args],
            self.env,
            self.state_dir / "logs" / f"{name}.log",
        )

    def applied(self) -> int:
        """Records the live generation has applied, over its partitions (0 before it exists)."""
        reader = self.reader()
        live = reader.registry.live()
        return sum(reader.freshness(live).values()) if live is not None else 0

    def kill_after(self, process: GroupProcess, applied: int, timeout: float = 240) -> int:
        """SIGKILL ``process`` once ``applied`` records are applied (mid-stream); how many were."""
        deadline = time.monotonic() + timeout
        while self.applied() < applied:
            assert process.alive(), process.log_tail()
            assert time.monotonic() < deadline, "processor made no progress"
            time.sleep(0.05)
        process.kill()
        return self.applied()

    def run_to_log_end(self, name: str) -> None:
        """Run a processor until it has applied the log as it is now, then stop it."""
        process = self.processor(name=name).start()
        try:
            with self.offsets() as offsets:
                wait_until_caught_up(
                    self.reader(), offsets, [self.topic.name], timeout=240, alive=process.alive
                )
        finally:
            process.stop()

    def state(self, generation: int | None = None) -> tuple[dict, dict]:
        reader = self.reader()
        return (
            dict(reader.scan("orders", generation)),
            reader.aggregate("order_totals", generation).value,
        )


def oracle(events) -> FoldResult:
    return fold_all(OrderStateProjection(), events)


@pytest.fixture
def world(kafka_bootstrap, redis_url, make_topic, unique, tmp_path) -> OrdersWorld:
    name = make_topic(partitions=ORDERS.partitions, prefix="orders")
    dlq = make_topic(partitions=1, prefix="dlq")
    prefix = f"test-{unique}"
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    redis_settings = RedisSettings(url=redis_url, key_prefix=prefix)
    options = OrderStateOptions(
        topics=[name],
        dead_letter_topic=dlq,
        notifications_topic=f"{name}.notifications",
        # Small batches: several micro-batches per test, and crash points between them.
        max_offsets_per_trigger=5000,
    )
    launcher = ProcessLauncher(
        kafka, redis_settings, SparkSettings(), tmp_path, {"order_state": options}
    )
    return OrdersWorld(
        topic=dataclasses.replace(ORDERS, name=name),
        dlq=dlq,
        kafka=kafka,
        redis=redis_settings,
        state_dir=tmp_path,
        launcher=launcher,
        client=redis_client(redis_url),
    )
