"""Settings of the order-state processor (environment: ``REFOLD_*``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts.settings import KafkaSettings, RedisSettings
from contracts.topics import ORDERS, dead_letter_topic
from processors.order_state.projection import DEFAULT_NOTIFICATIONS_TOPIC

__all__ = ["OrderStateSettings"]


class OrderStateSettings(BaseSettings):
    """Read once in ``__main__``; e.g. ``REFOLD_KAFKA__BOOTSTRAP_SERVERS=host:9092``."""

    model_config = SettingsConfigDict(
        env_prefix="REFOLD_", env_nested_delimiter="__", frozen=True, extra="ignore"
    )

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    state_dir: Path = Path(".state")
    # Topic names are overridable so tests and staging can run on their own topics.
    orders_topic: str = ORDERS.name
    dead_letter_topic: str = dead_letter_topic("order_state")
    # Shipping notices (the processor's side effect; not produced while replay rebuilds).
    notifications_topic: str = DEFAULT_NOTIFICATIONS_TOPIC
    # 200k records per micro-batch: big enough to amortise Spark's 0.3-0.9 s fixed cost per
    # batch during catch-up, small enough to bound executor memory.
    max_offsets_per_trigger: int = 200_000
    # Two tasks per batch on a 2-core machine measured fastest (DESIGN.md); raise on a cluster.
    max_tasks: int = 2
    trigger_interval: str = "250 milliseconds"
    # refold_kafka_ranges: each task reads its own records in the worker that folds them
    # (fastest here); refold_kafka: records through Spark; kafka: Spark's JVM connector.
    source_format: str = "refold_kafka_ranges"
